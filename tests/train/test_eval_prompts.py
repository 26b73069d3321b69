"""``ftkit train --eval-prompts FILE`` (issue 40 item 4): a held-out eval set read and checked like
``--prompts``, its digest recorded and checked on resume, never drawn for training, scored by
its own records at each publication; (slow) a real run logs ``eval_reward`` at each publication,
``--best-metric eval_reward`` keeps the checkpoint with the best one, and ``--resume`` refuses a
changed eval file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.model.hf_models import make_model
from tests.train.test_prompt_task import PROBLEMS, SHAPE, config, ftkit, write_prompts

EVAL = [(30, 4), (2, 9), (11, 11)]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return make_model("llama", tmp_path_factory.mktemp("hf"), eos=True)


def write_eval(path: Path, problems: list[tuple[int, int]] = EVAL) -> Path:
    return write_prompts(path, [json.dumps({"prompt": f"{a} + {b} =", "answer": a + b}) for a, b in problems])


def test_the_eval_set_is_its_own_file_never_drawn_for_training_and_scored_by_its_records(llama, tmp_path):
    from ftkit.tasks.prompt_task import PromptTask
    from ftkit.train.rl.rewards import get_reward

    plan = config(llama, write_prompts(tmp_path / "p.jsonl"), eval_prompts=str(write_eval(tmp_path / "e.jsonl")))
    task = plan.task.build()
    assert isinstance(task, PromptTask) and task.eval_overlap == 0
    scorer, prompts = task.eval_set(seed=0)
    assert prompts.shape == (len(EVAL), 12)  # every record once, in file order
    texts = [scorer.reward_sample(p, task.correct_responses(p[None])[0]).prompt for p in prompts]
    assert texts == [f"{a} + {b} =" for a, b in EVAL]
    eval_rows = {tuple(r.tolist()) for r in prompts}
    for rollout in range(6):  # several epochs of the training file: no eval row ever drawn
        drawn = {tuple(r.tolist()) for r in task.prompts(seed=0, rollout=rollout, count=len(PROBLEMS))}
        assert not drawn & eval_rows and len(drawn) == len(PROBLEMS)
    assert task.prompt_pads(prompts).tolist() == scorer.prompt_pads(prompts).tolist()  # engines pad them right
    right = scorer.correct_responses(prompts)
    exact = get_reward("exact_match", 10.0)
    assert exact(scorer, prompts, right).tolist() == [1.0] * len(EVAL)
    wrong = torch.full_like(right, task.stop_token)
    assert exact(scorer, prompts, wrong).tolist() == [0.0] * len(EVAL)
    alone = config(llama, write_prompts(tmp_path / "p.jsonl")).task.build()  # without the eval file: as before
    assert torch.equal(alone.prompts(0, 3, 4), task.prompts(0, 3, 4))
    scorer, prompts = alone.eval_set(seed=0)
    assert scorer is alone and torch.equal(prompts, alone.heldout_prompts(0))


def test_eval_prompts_that_are_training_prompts_are_counted_and_warned(llama, tmp_path):
    from ftkit.train.plan.run_plan import eval_warnings

    prompts = write_prompts(tmp_path / "p.jsonl")
    plan = config(llama, prompts, eval_prompts=str(write_eval(tmp_path / "e.jsonl", [(3, 4), (30, 4), (1, 1)])))
    task = plan.task.build()
    assert task.eval_overlap == 2
    (warning,) = eval_warnings(plan.config, task)
    assert warning.startswith("2 prompt(s) of the eval set") and "also appear in --prompts" in warning
    plan = config(llama, prompts, best_metric="eval_reward")  # no held-out file: say what is scored
    (warning,) = eval_warnings(plan.config, plan.task.build())
    assert "--best-metric eval_reward without --eval-prompts" in warning
    assert eval_warnings(config(llama, prompts).config, task) == []


def test_the_eval_file_is_recorded_by_path_and_digest_and_must_not_change(llama, tmp_path):
    from ftkit.errors import ConfigError
    from ftkit.train.config import load_config

    prompts, held = write_prompts(tmp_path / "p.jsonl"), write_eval(tmp_path / "e.jsonl")
    recorded = config(llama, prompts, eval_prompts=str(held)).config.model_dump(mode="json")
    assert recorded["eval_prompts"] == str(held.absolute()) and len(recorded["eval_prompts_digest"]) == 16
    digest = recorded["eval_prompts_digest"]
    assert config(llama, prompts, eval_prompts=str(held), eval_prompts_digest=digest).config.eval.eval_prompts_digest
    write_eval(held, EVAL[:2])
    with pytest.raises(ConfigError, match="eval: the prompt file .* has changed"):  # exit 2
        config(llama, prompts, eval_prompts=str(held), eval_prompts_digest=digest)
    with pytest.raises(ConfigError, match="eval_prompts need prompts"):  # the addition task: refused
        load_config({"eval_prompts": str(held)})
    with pytest.raises(ConfigError, match="checkpoint_every 0 publishes none"):
        load_config({"model": str(llama), "prompts": str(prompts), "reward": "exact_match", "eval_prompts": str(held),
                     "checkpoint_every": 0})  # fmt: skip
    from ftkit.runs.configs import config_diff

    before = {k: v for k, v in recorded.items() if not k.startswith("eval_prompts")}  # an older run's record
    without = {**recorded, "eval_prompts": None, "eval_prompts_digest": ""}
    assert config_diff(before, without) == []  # an older run had no eval file
    rows = config_diff(without, recorded)
    assert {r["field"] for r in rows} == {"eval_prompts", "eval_prompts_digest"}
    assert {r["kind"] for r in rows} == {"result"}


def test_eval_file_errors_are_exit_2_before_ray(llama, tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl")
    base = ("train", "--out", str(tmp_path / "run"), "--reward", "exact_match", *SHAPE, "--model", str(llama))
    base = (*base, "--prompts", str(prompts))
    bad = write_prompts(tmp_path / "bad.jsonl", [json.dumps({"prompt": "1 + 1 =", "answer": 2}), '{"prompt": "2 +'])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    nokey = write_prompts(tmp_path / "nokey.jsonl", [json.dumps({"question": "1 + 1 =", "answer": 2})])
    long = write_prompts(tmp_path / "long.jsonl", [json.dumps({"prompt": "Paris is in France. " * 6, "answer": 0})])
    cases = [
        (bad, f"{bad}:2 is not valid JSON"),
        (empty, f"prompt file {empty} holds no prompts"),
        (nokey, f"{nokey}:1 has no key 'prompt'"),
        (long, f"prompt at {long}:1 has"),
        (tmp_path / "missing.jsonl", "does not exist"),
    ]
    for path, message in cases:
        res = ftkit(*base, "--eval-prompts", str(path))
        assert res.returncode == 2 and message in res.stderr, res.stderr
        assert "Traceback" not in res.stderr and "Hint:" in res.stderr, res.stderr
    res = ftkit("train", "--out", str(tmp_path / "run"), "--eval-prompts", str(prompts))  # the addition task
    assert res.returncode == 2 and "eval_prompts need prompts" in res.stderr, res.stderr
    assert not (tmp_path / "run").exists()


def _lines(run: Path) -> list[dict]:
    return [json.loads(x) for p in sorted((run / "events").glob("*.jsonl")) for x in p.read_text().splitlines()]


@pytest.mark.slow
def test_eval_reward_is_logged_at_each_publication_ranks_checkpoints_and_pins_the_file(llama, tmp_path):
    prompts, held = write_prompts(tmp_path / "p.jsonl"), write_eval(tmp_path / "e.jsonl", [(3, 4), *EVAL])
    run = tmp_path / "run"
    res = ftkit(
        "train", "--model", str(llama), "--prompts", str(prompts), "--eval-prompts", str(held), *SHAPE,
        "--reward", "deterministic_random", "--rollouts", "3", "--steps-per-rollout", "1",
        "--samples-per-rollout", "8", "--micro-shards", "1", "--group-size", "4", "--cells", "1",
        "--dump-rollouts", "none", "--lr", "0.05", "--keep-last", "1", "--keep-best", "1",
        "--best-metric", "eval_reward", "--out", str(run),
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "Warning: 1 prompt(s) of the eval set" in res.stderr, res.stderr  # (3, 4) is a training prompt
    lines = _lines(run)
    metrics = [e for e in lines if e["type"] == "metric" and e["step"] is None]
    evals = {e["rollout"]: e["values"]["eval_reward"] for e in metrics if "eval_reward" in e["values"]}
    assert sorted(evals) == [0, 1, 2] and all(v in (0.0, 0.25, 0.5, 0.75, 1.0) for v in evals.values())
    published = sorted((e for e in lines if e["type"] == "checkpoint_published"), key=lambda e: e["step"])
    assert [(e["step"], e["metric"]) for e in published] == [(r, evals[r]) for r in range(3)]
    best = max(range(3), key=lambda r: (evals[r], r))  # ties go to the newer step
    ck = run / "checkpoints"
    assert {p.name for p in ck.glob("step_*")} == {f"step_{best:06d}", "step_000002"}
    doc = json.loads((ck / "retention.json").read_text())
    assert doc["policy"]["best_metric"] == "eval_reward"
    assert "best" in {r["name"]: r["roles"] for r in doc["records"]}[f"step_{best:06d}"]
    recorded = json.loads((run / "run.json").read_text())["config"]
    assert recorded["eval_prompts"] == str(held) and len(recorded["eval_prompts_digest"]) == 16
    write_eval(held, EVAL)  # the eval file changes: a resumed run must refuse it, before Ray
    res = ftkit("train", "--resume", str(run), "--rollouts", "4")
    assert res.returncode == 2 and "eval: the prompt file" in res.stderr and "has changed" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.slow
def test_eval_prompts_without_best_metric_still_log_eval_reward(llama, tmp_path):
    prompts, held = write_prompts(tmp_path / "p.jsonl"), write_eval(tmp_path / "e.jsonl")
    run = tmp_path / "run"
    res = ftkit(
        "train", "--model", str(llama), "--prompts", str(prompts), "--eval-prompts", str(held), *SHAPE,
        "--reward", "exact_match", "--rollouts", "2", "--steps-per-rollout", "1", "--samples-per-rollout", "8",
        "--micro-shards", "1", "--group-size", "4", "--cells", "1", "--dump-rollouts", "none", "--out", str(run),
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "of the eval set" not in res.stderr, res.stderr  # no overlap: no warning about it
    lines = _lines(run)
    metrics = [e for e in lines if e["type"] == "metric" and e["step"] is None]
    evals = {e["rollout"]: e["values"]["eval_reward"] for e in metrics if "eval_reward" in e["values"]}
    rewards = {e["rollout"]: e["values"]["reward"] for e in metrics if "reward" in e["values"]}
    assert sorted(evals) == [0, 1]
    published = sorted((e for e in lines if e["type"] == "checkpoint_published"), key=lambda e: e["step"])
    assert [e["metric"] for e in published] == [rewards[0], rewards[1]]  # ranked by the rollout reward
