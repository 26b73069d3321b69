"""``ftkit train --reward`` with the plug-in contract (issue 22 item 2) on the embedded addition
task: the sample a plug-in sees, the refusals before Ray starts (unresolvable, raising,
non-finite, not deterministic: exit 2, one line), and a real run whose recorded rewards are the
plug-in's scores of the recorded tokens."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ftkit.errors import FtkitError
from ftkit.tasks.addition import DIGIT0, EOS, PROMPT_LEN, AdditionTask
from ftkit.train.rl.rewards import check_reward, get_reward

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = """
import random
def echo_len(prompt, response, label, prompt_ids, response_ids):
    return float(len(response)) + (1.0 if response.lstrip("0") == label else 0.0)
def noisy(**kwargs):
    return random.random()
def boom(**kwargs):
    raise ValueError("no")
def infinite(**kwargs):
    return float("inf")
def per_session(response, **kwargs):
    import os
    return float(len(response)) + float(os.environ.get("RW_SESSION_SHIFT", "0"))
"""


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "rw_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_a_plug_in_sees_the_prompt_the_answer_up_to_eos_and_the_label() -> None:
    task = AdditionTask(response_len=5)
    prompt = task._prompts(torch.tensor([[3, 4]]))[0]
    response = torch.tensor([DIGIT0 + 0, DIGIT0 + 7, EOS, DIGIT0 + 9, 0])
    sample = task.reward_sample(prompt, response)
    assert (sample.prompt, sample.response, sample.label) == ("3 + 4 =", "07", "7")
    assert list(sample.prompt_ids) == prompt.tolist() and len(sample.prompt_ids) == PROMPT_LEN
    assert list(sample.response_ids) == response.tolist()


def test_exact_match_scores_the_correct_responses_one_and_others_zero() -> None:
    task = AdditionTask(response_len=4)
    prompts = task.heldout_prompts(seed=1)
    right = task.correct_responses(prompts)
    assert get_reward("exact_match")(task, prompts, right).tolist() == [1.0] * len(prompts)
    wrong = right.clone()
    wrong[:, 1] = DIGIT0 + (wrong[:, 1] - DIGIT0 + 1) % 10
    assert get_reward("exact_match")(task, prompts, wrong).tolist() == [0.0] * len(prompts)


def test_a_module_function_plug_in_scores_every_sample(plugin_dir: Path) -> None:
    task = AdditionTask(response_len=4)
    prompts = task.heldout_prompts(seed=2)[:3]
    got = get_reward("rw_plugin:echo_len")(task, prompts, task.correct_responses(prompts))
    assert got.dtype == torch.float32 and got.tolist() == [3.0, 3.0, 3.0]  # "0d" or "dd", right


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("rw_plugin:noisy", "is not deterministic"),
        ("rw_plugin:boom", "raised ValueError: no on sample 0"),
        ("rw_plugin:infinite", "returned inf on sample 0"),
        ("rw_plugin:absent", "has no attribute 'absent'"),
        ("no_such_module_here:fn", "cannot import reward module"),
    ],
)
def test_a_bad_plug_in_is_refused_before_the_run(plugin_dir: Path, spec: str, says: str) -> None:
    with pytest.raises(FtkitError, match=re.escape(says)):  # ConfigError or RewardError: exit 2
        check_reward(spec, AdditionTask(4), seed=0)


def _ftkit(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "ftkit", *args], cwd=cwd, capture_output=True, text=True, timeout=600, env=env
    )


def test_the_cli_refuses_a_non_deterministic_plug_in_with_one_line_before_ray(plugin_dir: Path) -> None:
    res = _ftkit(plugin_dir, "train", "--out", str(plugin_dir / "run"), "--reward", "rw_plugin:noisy")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert res.stderr.startswith("Error: reward 'rw_plugin:noisy' is not deterministic"), res.stderr[-2000:]
    assert not (plugin_dir / "run" / "events").exists()  # refused before anything started


@pytest.mark.slow
def test_a_run_records_the_plug_in_s_scores_of_its_own_tokens(plugin_dir: Path) -> None:
    from ftkit.tasks.addition import PROMPT_LEN as P
    from ftkit.train.rl.rollouts import load, rollout_path

    run = plugin_dir / "run"
    res = _ftkit(plugin_dir, "train", "--out", str(run), "--rollouts", "1", "--reward", "rw_plugin:echo_len")
    assert res.returncode == 0, res.stderr[-3000:]
    batch = load(rollout_path(run, 0))
    task = AdditionTask(response_len=batch["tokens"].shape[1] - P)
    want = get_reward("rw_plugin:echo_len")(task, batch["tokens"][:, :P], batch["tokens"][:, P:])
    assert torch.equal(batch["rewards"], want)


def test_a_plug_in_calling_sys_exit_fails_the_run_and_a_signal_meanwhile_stays_a_signal(plugin_dir: Path) -> None:
    """``sys.exit(0)`` in a plug-in is its failure (exit 2), never a silent exit 0; ftkit's own
    error raised during the call (a signal's RunInterrupted) is not taken for the plug-in's."""
    from ftkit.tasks.rewards import RewardError, load_reward, score_one
    from ftkit.train.control.run_end import RunInterrupted

    (plugin_dir / "rw_exit.py").write_text(
        "import sys\nfrom ftkit.train.control.run_end import RunInterrupted\n"
        "def quits(**kwargs):\n    sys.exit(0)\n"
        "def interrupted(**kwargs):\n    raise RunInterrupted(15)\n"
    )
    sample = AdditionTask(response_len=4).reward_sample(torch.tensor([1, 8, 3, 9, 4]), torch.tensor([5, 12, EOS, 0]))
    with pytest.raises(RewardError, match="raised SystemExit"):
        score_one(load_reward("rw_exit:quits"), 0, sample)
    with pytest.raises(RunInterrupted):
        score_one(load_reward("rw_exit:interrupted"), 0, sample)


def test_a_rollout_scored_again_must_score_its_unchanged_samples_the_same() -> None:
    from ftkit.tasks.rewards import RewardError
    from ftkit.train.rl.rewards import check_rescored

    tokens = torch.arange(12).reshape(3, 4)
    recorded = {"tokens": tokens, "rewards": torch.tensor([1.0, 0.0, 0.5])}
    check_rescored("r", 2, recorded, {"tokens": tokens.clone(), "rewards": torch.tensor([1.0, 0.0, 0.5])})
    changed = tokens.clone()
    changed[1, 0] = 99  # other tokens (other weights): their reward may differ
    check_rescored("r", 2, recorded, {"tokens": changed, "rewards": torch.tensor([1.0, 7.0, 0.5])})
    with pytest.raises(RewardError, match=r"'r' is not deterministic: rollout 2 was recorded with 0.5 .* sample 2"):
        check_rescored("r", 2, recorded, {"tokens": tokens, "rewards": torch.tensor([1.0, 0.0, 0.25])})
    with pytest.raises(RewardError, match="sample 0"):  # -0.0 is not 0.0: bits, not values
        check_rescored(
            "r", 2, {"tokens": tokens, "rewards": torch.zeros(3)}, {"tokens": tokens, "rewards": -torch.zeros(3)}
        )


@pytest.mark.full
@pytest.mark.slow
def test_a_resumed_run_whose_plug_in_scores_a_regenerated_rollout_differently_fails(
    plugin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reward deterministic within a process but not across sessions passes the start-up
    check; the resumed session regenerates rollout 2 (its checkpoint is after rollout 1) and
    the moved score is exit 2 naming the plug-in, the rollout and the sample."""
    run = plugin_dir / "run"
    small = ["--samples-per-rollout", "16", "--group-size", "4", "--micro-shards", "2", "--cells", "1"]
    args = ["--reward", "rw_plugin:per_session", "--checkpoint-every", "2", *small]
    first = _ftkit(plugin_dir, "train", "--out", str(run), "--rollouts", "3", *args)
    assert first.returncode == 0, first.stderr[-2000:]
    monkeypatch.setenv("RW_SESSION_SHIFT", "0.5")  # the next session's plug-in scores differently
    resumed = _ftkit(plugin_dir, "train", "--resume", str(run), "--rollouts", "4")
    assert resumed.returncode == 2 and "Traceback" not in resumed.stderr, resumed.stderr[-2000:]
    assert "reward 'rw_plugin:per_session' is not deterministic: rollout 2 was recorded with" in resumed.stderr
