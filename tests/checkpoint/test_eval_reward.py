"""``--best-metric eval_reward``: the driver's evaluation at a publication boundary
(``RunCheckpoints.eval_reward``) with stand-in engines; the real engines and a real run are
covered by ``tests/train/test_engines.py`` and ``test_train_checkpoints.py``."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from ftkit.tasks.addition import EOS, AdditionTask
from ftkit.train.config import TrainConfig


class _Engines:
    """Answers the held-out prompts right (or with a non-finite-logit marker) and records calls."""

    def __init__(self, task: AdditionTask, marker: bool = False) -> None:
        self.task, self.marker, self.calls = task, marker, []

    def generate(self, prompts: Any, rollout: int, greedy: bool = False) -> Any:
        self.calls.append((prompts.clone(), rollout, greedy))
        out = torch.full((prompts.shape[0], self.task.response_len), EOS, dtype=torch.int64)
        out[:, :3] = self.task.answers(prompts)
        out[:2, 1] = out[:2, 1] + 1 if not self.marker else -1  # two wrong units digits (or no answer)
        return out, torch.zeros(out.shape, dtype=torch.float32)  # (responses, log-probs)


class _Events:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def emit(self, type_: str, **fields: Any) -> None:
        self.lines.append((type_, fields))


def _checkpoints(tmp_path, engines: _Engines, events: _Events):  # noqa: ANN202
    from ftkit.train.control.checkpoints import RunCheckpoints

    cfg = TrainConfig(seed=5, response_len=4, best_metric="eval_reward", reward="task")
    return RunCheckpoints(cfg, tmp_path / "run", None, events, engines, engines.task, ())


def test_eval_reward_is_the_greedy_mean_task_reward_of_the_heldout_set(tmp_path) -> None:
    task = AdditionTask(4)
    engines, events = _Engines(task), _Events()
    value = _checkpoints(tmp_path, engines, events).eval_reward(rollout=2)
    (prompts, rollout, greedy), *more = engines.calls
    assert not more and greedy and rollout == 2
    assert torch.equal(prompts, task.heldout_prompts(seed=5))
    n = prompts.shape[0]
    assert value == pytest.approx((n - 2 / 3) / n)  # two of n answers lose a third each (the units digit)
    assert events.lines == [("metric", {"rollout": 2, "step": None, "values": {"eval_reward": value}})]


def test_eval_reward_is_nan_when_a_logit_was_not_finite(tmp_path) -> None:
    task = AdditionTask(4)
    events = _Events()
    value = _checkpoints(tmp_path, _Engines(task, marker=True), events).eval_reward(rollout=0)
    assert math.isnan(value) and math.isnan(events.lines[0][1]["values"]["eval_reward"])
