"""bf16 training keeps every invariant bitwise (issue 37, docs/training.md "Precision"): real Ray
actors and megatron ranks on the ``tiny`` preset in bf16 with float32 masters.

- **Membership invariance.** One cell, two cells and three cells end ``compare-dumps --exact``
  equal (final masters, dumps, rollouts), and the engines were sent the same bf16 weights.
- **Heal.** ``SIGKILL`` of cell 1's rank after step 0: the run heals cell 1 from cell 0 (the
  fp32 masters and optimizer state) and ends bitwise the fault-free run.
- **Engines.** The megatron engine computes in bf16 with the trainer's kernels: FT114 checked its
  canary log-probs bitwise (no finding in exact mode), FT102 checked every weight version sent
  against the bf16 weights the trainers fingerprint (``state_fingerprint.weights``).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from faultkit import Trigger, all_events
from test_fault_tolerance import weights_sent

from ftkit.cli import main
from ftkit.train.config import TrainConfig
from ftkit.train.control.driver import run_training
from ftkit.train.plan.run_plan import build_plan

pytestmark = pytest.mark.slow

BASE = dict(
    rollouts=3,
    steps_per_rollout=2,
    samples_per_rollout=16,
    micro_shards=4,
    group_size=4,
    seed=29,
    precision="bf16",
    collective_timeout=5.0,
    step_timeout=40.0,
)


@pytest.fixture(scope="module")
def runs(ray_session, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("bf16")
    return {n: run_training(build_plan(TrainConfig(**BASE, cells=n, out=root / f"c{n}"))) for n in (1, 2)}


def _clean(result) -> None:
    assert result.steps_committed == result.steps_total
    assert result.analysis.verdict("error") == "pass", result.analysis.findings
    assert json.loads((result.run_dir / "status.json").read_text())["status"] == "completed"


def test_bf16_runs_record_their_precision_and_fingerprint_the_bf16_weights(runs) -> None:
    run = runs[2].run_dir
    _clean(runs[2])
    assert json.loads((run / "run.json").read_text())["config"]["precision"] == "bf16"
    fp = all_events(run, "state_fingerprint")
    assert fp and all(set(e["weights"]) == set(e["params"]) for e in fp)
    assert all(e["weights"] != e["params"] for e in fp)  # bf16 weights, float32 masters
    checked = {r.code: r.checked for r in runs[2].analysis.rules}  # FT102: weights sent, FT114: canaries
    assert checked.get("FT102", 0) > 0 and checked.get("FT114", 0) > 0, checked


def test_bf16_one_cell_equals_two_cells_bitwise(runs) -> None:
    _clean(runs[1])
    assert main(["compare-dumps", "--exact", str(runs[1].run_dir), str(runs[2].run_dir)]) == 0
    assert weights_sent(runs[1].run_dir) == weights_sent(runs[2].run_dir)


def test_bf16_sigkill_healed_run_equals_the_fault_free_run(runs, tmp_path: Path) -> None:
    out = tmp_path / "kill"
    trigger = Trigger(out, cell=1, step=0, action=lambda pid: os.kill(pid, signal.SIGKILL))
    trigger.start()
    result = run_training(build_plan(TrainConfig(**BASE, cells=2, out=out)))
    assert trigger.fired is not None
    _clean(result)
    heals = all_events(out, "heal")
    assert [(h["cell"], h["donor"]) for h in heals] == [(1, 0)]
    assert main(["compare-dumps", "--exact", str(out), str(runs[2].run_dir)]) == 0
    assert weights_sent(out) == weights_sent(runs[2].run_dir)
