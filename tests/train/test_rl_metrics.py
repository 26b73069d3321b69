"""The metrics an RL engineer watches (issue 40 item 2): per rollout (``rollout_stats``) and per
GRPO step (``step_metrics``), their membership invariance, and the warning (live output and rule
FT116) for a rollout that learns nothing because every advantage is 0. The real runs: a GRPO run
with a KL reference on 1 cell and on 2 cells, and a run whose reward never varies."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from ftkit.engines.policy import allowed_index, policy_logprobs, policy_logprobs_entropy
from ftkit.tasks.addition import AdditionTask
from ftkit.tasks.stops import Stops
from ftkit.train.rank.step_metrics import StepMetrics
from ftkit.train.rl.grpo import GrpoConfig, token_loss
from ftkit.train.rl.logprob_stats import compare_logprobs
from ftkit.train.rl.rollout_stats import idle_warning, rollout_metrics

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--rollouts", "2", "--samples-per-rollout", "32", "--group-size", "4", "--micro-shards", "4"]
GRPO = ["--loss", "grpo", "--kl-coef", "0.05", "--clip-high", "0.28", "--steps-per-rollout", "2"]
STEP_NAMES = {"entropy", "clip_fraction", "kl"}
CHECK_NAMES = {"logprob_diff_mean_abs", "logprob_diff_max_abs", "logprob_diff_k3"}
ROLLOUT_NAMES = {
    "reward",
    "reward_std",
    "reward_min",
    "reward_max",
    "zero_advantage_groups",
    "response_length_mean",
    "response_length_max",
    "truncated_fraction",
    "gen_tokens_per_s",
}


class _Task:
    response_len = 4

    def response_ends(self, responses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return Stops(None, eos=9).ends(responses)  # no stop strings: nothing to decode


def test_rollout_metrics_of_a_batch() -> None:
    responses = torch.tensor([[1, 9, 0, 0], [1, 2, 3, 4], [9, 0, 0, 0], [1, 2, 3, 9]])
    batch = {
        "tokens": torch.cat([torch.full((4, 3), 5), responses], dim=1),
        "rewards": torch.tensor([1.0, 0.0, 0.5, 0.5]),
        "advantages": torch.tensor([1.0, -1.0, 0.0, 0.0]),
    }
    values = rollout_metrics(batch, _Task(), group_size=2, generation_seconds=2.0)
    assert values["reward_std"] == pytest.approx(float(batch["rewards"].double().std(unbiased=False)))
    assert (values["reward_min"], values["reward_max"]) == (0.0, 1.0)
    assert values["zero_advantage_groups"] == 0.5  # the second group's rewards are equal
    assert (values["response_length_mean"], values["response_length_max"]) == (2.75, 4.0)  # 2, 4, 1, 4
    assert values["truncated_fraction"] == 0.25  # only the second never reached the stop token
    assert values["gen_tokens_per_s"] == 11 / 2.0
    lengths, stopped = AdditionTask(response_len=4).response_ends(responses)  # fixed length, never cut
    assert lengths.tolist() == [4] * 4 and stopped.all()
    assert idle_warning(0, values) is None
    message = idle_warning(3, {"reward": 0.5, "zero_advantage_groups": 1.0})
    assert message is not None and message.startswith("rollout 3 learns nothing")


def test_step_metrics_are_the_same_for_any_split_of_the_micro_shards() -> None:
    torch.manual_seed(0)
    allowed, tokens = torch.tensor([0, 2, 3]), torch.tensor([[0, 2, 3, 3, 2]] * 4)
    index = allowed_index(allowed.tolist(), 6)
    logits = torch.randn(4, 5, 6, requires_grad=True)
    mask = torch.ones(4, 5)
    mask[:, -1] = 0
    lp, entropy = policy_logprobs_entropy(logits, tokens, allowed, index, mask > 0)
    assert torch.equal(lp, policy_logprobs(logits, tokens, allowed, index)) and lp.requires_grad  # the same bits
    p = logits.detach()[..., allowed].softmax(-1)[mask > 0]
    assert not entropy.requires_grad and torch.allclose(entropy, -(p * p.log()).sum(-1))
    entropy = entropy.reshape(4, 4)  # per sample: its 4 learned positions
    logp, old = torch.randn(4, 5) - 2, torch.randn(4, 5) - 2
    terms = token_loss(logp, old, torch.tensor([1.0, -1.0, 0.5, 0.0]), mask, GrpoConfig(kl_coef=0.1), logp - 0.1)
    engine = logp + torch.where(torch.arange(5) == 1, 0.25, 0.0)
    result = compare_logprobs(engine, logp, mask)

    def run(shards: list[int]) -> StepMetrics:
        """A cell computing micro-shards ``shards`` (one sample each) of a 4-shard step."""
        sm = StepMetrics(4, 8, reference=True, device="cpu")
        for m in shards:
            part = slice(m, m + 1)
            sub = type(terms)(terms.loss[part], terms.ratio[part], terms.clipped[part], terms.kl[part])
            sm.add_shard(m, entropy[part], sub)
        sm.add_comparison(type(result)([result.samples[m] for m in shards], [], result.step), [4 + m for m in shards])
        return sm

    learned, losses = int(mask.sum()), torch.zeros(4, dtype=torch.float64)
    alone = run([0, 1, 2, 3])
    one = alone.unpack(alone.side(losses), losses.clone(), learned)
    a, b = run([0, 1]), run([2, 3])
    two = a.unpack(a.side(losses) + b.side(losses), losses.clone(), learned)  # the sum is the all-reduce
    assert one == two and set(one) == STEP_NAMES | CHECK_NAMES
    assert one["entropy"] == pytest.approx(float(entropy.double().mean()))
    assert one["clip_fraction"] == float(terms.clipped.sum()) / learned
    assert one["kl"] == pytest.approx(float(terms.kl.double().sum()) / learned)
    assert one["logprob_diff_max_abs"] == pytest.approx(0.25) and one["logprob_diff_mean_abs"] == pytest.approx(
        0.25 / 4
    )
    assert one["logprob_diff_k3"] == pytest.approx(result.step.k3)


def _ftkit(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), FTKIT_PROGRESS="0")
    return subprocess.run(
        [sys.executable, "-m", "ftkit", *args], cwd=cwd, capture_output=True, text=True, timeout=900, env=env
    )


def _metrics(run: Path) -> list[dict[str, Any]]:
    out = []
    for f in sorted((run / "events").glob("driver*.jsonl")):
        out += [e for e in map(json.loads, f.read_text().splitlines()) if e["type"] == "metric"]
    return out


@pytest.fixture(scope="module")
def grpo_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("rlm")
    out = {}
    for name, cells in (("one", "1"), ("two", "2")):
        res = _ftkit(ROOT, "train", "--out", str(base / name), *SMALL, *GRPO, "--cells", cells)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert "entropy " in res.stderr and "clip " in res.stderr and "gen " in res.stderr  # the live lines
        out[name] = base / name
    return out


@pytest.mark.slow
def test_a_grpo_runs_metrics_are_present_plausible_and_membership_invariant(grpo_runs: dict[str, Path]) -> None:
    from ftkit.runs.diff import VOLATILE
    from ftkit.tasks.addition import PROMPT_LEN, RESPONSE_TOKENS
    from ftkit.train.rl.rollouts import load, rollout_path

    run = grpo_runs["one"]
    per_rollout = [e for e in _metrics(run) if e["step"] is None]
    per_step = [e for e in _metrics(run) if e["step"] is not None]
    assert len(per_rollout) == 2 and len(per_step) == 4
    for ev in per_rollout:
        v, batch = ev["values"], load(rollout_path(run, ev["rollout"]))
        rewards, response_len = batch["rewards"].double(), batch["tokens"].shape[1] - PROMPT_LEN
        assert set(v) == ROLLOUT_NAMES
        assert v["reward"] == float(rewards.mean()) and v["reward_std"] == float(rewards.std(unbiased=False))
        assert (v["reward_min"], v["reward_max"]) == (float(rewards.min()), float(rewards.max()))
        groups = batch["advantages"].reshape(-1, 4)
        assert v["zero_advantage_groups"] == float((groups == 0).all(dim=1).double().mean()) < 1.0
        assert 0 < v["response_length_mean"] <= v["response_length_max"] <= response_len
        assert v["truncated_fraction"] == 0.0 and v["gen_tokens_per_s"] > 0  # the addition task: fixed length
    for ev in per_step:
        v = ev["values"]
        first = ev["step"] % 2 == 0
        assert set(v) >= STEP_NAMES and (set(v) >= CHECK_NAMES) == first
        assert 0.0 <= v["clip_fraction"] <= 1.0 and v["kl"] >= 0.0
        assert 0.0 < v["entropy"] <= math.log(len(RESPONSE_TOKENS)) + 1e-6
        if first:  # the megatron engine's log-probs are the trainer's, bit for bit: ratio 1, nothing clipped
            assert v["logprob_diff_max_abs"] == v["logprob_diff_mean_abs"] == v["logprob_diff_k3"] == 0.0
            assert v["clip_fraction"] == 0.0
        if ev["step"] == 0:  # the policy is still the reference
            assert v["kl"] == 0.0
    assert any(e["values"]["clip_fraction"] > 0 for e in per_step)  # later steps move off the behaviour policy

    def numerics(r: Path) -> list[tuple[Any, ...]]:
        return [(e["step"], {k: x for k, x in e["values"].items() if not VOLATILE.search(k)}) for e in _metrics(r)]

    assert numerics(grpo_runs["one"]) == numerics(grpo_runs["two"])  # bitwise, whatever the cell count
    res = _ftkit(ROOT, "compare-runs", str(grpo_runs["one"]), str(grpo_runs["two"]), "--format", "json")
    assert res.returncode == 0, res.stdout[-2000:]


@pytest.mark.slow
def test_a_reward_that_never_varies_is_warned_about_and_found(tmp_path: Path) -> None:
    (tmp_path / "rw_const.py").write_text("def constant(**kwargs):\n    return 0.5\n")
    run = tmp_path / "run"
    res = _ftkit(tmp_path, "train", "--out", str(run), *SMALL, "--reward", "rw_const:constant")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]  # a warning, not a failure
    assert res.stderr.count("learns nothing: every group's advantages are 0") == 2  # both rollouts
    metrics = _metrics(run)
    assert [e["values"]["zero_advantage_groups"] for e in metrics if e["step"] is None] == [1.0, 1.0]
    assert all(e["values"]["loss"] == 0.0 for e in metrics if e["step"] is not None)
    report = json.loads(_ftkit(ROOT, "analyze-events", str(run), "--format", "json").stdout)
    found = [f for f in report["findings"] if f["code"] == "FT116"]
    assert len(found) == 2 and {f["severity"] for f in found} == {"warning"}
    assert "rollout 0 learns nothing" in found[0]["message"]
