"""The fault-tolerance invariants on a Hugging Face model (issue 21, item 6): a small random-init
GQA Llama (4 query over 2 KV heads, untied, vocabulary 300, padded alike at TP 1 and 2) trained
through ``--model DIR`` by real Ray actors and megatron ranks, and checked from artefacts only.

- **Heal.** The test itself sends ``SIGKILL`` to cell 1's rank process (its pid from the rank's
  own events) after step 0: the run detects the death, heals cell 1 from cell 0 and ends
  ``compare-dumps --exact`` equal to the fault-free 2-cell run, the engines sent the same
  weights, the log analyzes clean with the heal verified (FT107 checked it).
- **Resume.** ``ftkit train`` (with its local Ray) is ``SIGKILL``ed from outside once its first
  checkpoint is published; ``ftkit train --resume`` (on one cell) ends bitwise the
  uninterrupted run; ``verify-checkpoint`` passes on both runs.
- **Layouts.** PP=2 is bitwise the PP=1 run (final state, dumps, step losses, engine weights and
  the checkpoints' bits, docs/training.md), at TP 1 and at TP 2 (TP=2 x PP=2, four ranks per
  cell, is bitwise the TP=2 run); TP=2 is not bitwise (its all-reduces sum in another
  order, docs/checkpoints.md) but starts from the same weights and analyzes clean.
- **Analyze clean** means more than no findings: the witness rules (FT103-FT105) checked every
  sample of every rollout, FT102 every engine's every weight version, FT101 the replicas.
- A tied model at ``--pp 2`` is exit 2 naming the reason, before anything is started.

The fault-free runs are shared by the module (about 20 s each on two cores).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from faultkit import Trigger, all_events
from test_fault_tolerance import weights_sent
from test_pipeline import checkpoint_files, step_metrics

from ftkit.cli import main
from ftkit.train.config import TrainConfig
from ftkit.train.control.driver import run_training
from ftkit.train.plan.run_plan import build_plan
from tests.model.hf_models import make_model

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ROLLOUTS, SAMPLES, ENGINES = 2, 8, 1
BASE = dict(
    rollouts=ROLLOUTS,
    steps_per_rollout=2,
    samples_per_rollout=SAMPLES,
    micro_shards=2,
    group_size=4,
    reward="deterministic_random",
    seed=3,
    collective_timeout=5.0,
    step_timeout=60.0,
)
RUNS = {
    "base": dict(cells=2),
    "pp2": dict(cells=1, pp=2),
    "tp2": dict(cells=1, tp=2),
    "tp2pp2": dict(cells=1, tp=2, pp=2),  # 4 ranks in one cell
}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("llama", tmp_path_factory.mktemp("hf"), eos=True, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def runs(ray_session, model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("hf-runs")
    return {
        n: run_training(build_plan(TrainConfig(**BASE, **kw, model=str(model), out=root / n))) for n, kw in RUNS.items()
    }


def rules(result) -> dict[str, tuple[int, str]]:
    return {r.code: (r.checked, r.status) for r in result.analysis.rules}


def assert_analyzed_clean(result, cells: int, ranks: int = 1) -> None:
    """No finding, and the rules that prove the invariants checked what the run holds."""
    assert result.steps_committed == result.steps_total == ROLLOUTS * 2
    assert result.analysis.findings == [], result.analysis.findings
    checked = rules(result)
    for code in ("FT103", "FT104", "FT105"):  # every allocated sample, counted exactly once
        assert checked[code] == (ROLLOUTS * SAMPLES, "passed"), (code, checked)
    # every engine's every weight version (0..ROLLOUTS), and, with one rank per cell (the engines get
    # full tensors), each version sent after a rollout against the trainers' committed state (1..ROLLOUTS)
    committed = ROLLOUTS if ranks == 1 else 0
    assert checked["FT102"] == (ENGINES * (ROLLOUTS + 1) + committed, "passed"), checked
    # each committed step's witness counts, and with 2 cells their fingerprints too
    assert checked["FT101"][1] == "passed" and checked["FT101"][0] >= result.steps_total + (cells > 1)
    counts = all_events(result.run_dir, "witness_counts")
    assert counts and {c for e in counts for c in e["counts"]} == {1}
    assert json.loads((result.run_dir / "status.json").read_text())["status"] == "completed"


def test_fault_free_runs_analyze_clean_in_every_layout(runs):
    for name, kw in RUNS.items():
        assert_analyzed_clean(runs[name], kw["cells"], kw.get("tp", 1) * kw.get("pp", 1))
        assert main(["verify-checkpoint", str(runs[name].run_dir)]) == 0, name


@pytest.mark.parametrize(
    "pp1, pp2, finals",
    [
        ("base", "pp2", ["tp0-pp0", "tp0-pp1"]),
        ("tp2", "tp2pp2", ["tp0-pp0", "tp0-pp1", "tp1-pp0", "tp1-pp1"]),
    ],
    ids=["tp1", "tp2"],
)
def test_pp2_is_bitwise_the_pp1_run(runs, pp1, pp2, finals):
    """At TP 1 and at TP 2 (TP=2 x PP=2: four ranks per cell), splitting the layers over two
    stages changes no bit: dumps, engine weights, losses and checkpoints."""
    base, split = runs[pp1].run_dir, runs[pp2].run_dir
    assert main(["compare-dumps", "--exact", str(base), str(split)]) == 0
    assert sorted(p.rsplit("/", 1)[1] for p in runs[pp2].final_files) == [f"{f}.safetensors" for f in finals]
    assert weights_sent(split) == weights_sent(base) and len(weights_sent(base)) == ROLLOUTS + 1
    assert step_metrics(split, "loss") == step_metrics(base, "loss")
    got, want = checkpoint_files(split), checkpoint_files(base)
    assert sorted(got) == sorted(want) and got
    for f, tensors in want.items():
        assert sorted(got[f]) == sorted(tensors) and all(torch.equal(got[f][k], t) for k, t in tensors.items()), f
    tp_ranks = {0, 1} if pp1 == "tp2" else {0}
    assert {e["rank"] for e in all_events(split, "witness_counts")} == tp_ranks  # the embedding's stage counts


def test_tp2_starts_from_the_tp1_weights(runs):
    base, tp2 = runs["base"].run_dir, runs["tp2"].run_dir
    assert weights_sent(tp2)[0] == weights_sent(base)[0]  # the TP=2 shards gather to the TP=1 import
    # the GRPO loss is a near-cancelling sum over a group (~1e-3 here): its rounding is absolute
    assert step_metrics(tp2, "loss")[0] == pytest.approx(step_metrics(base, "loss")[0], rel=1e-5, abs=1e-6)
    assert len(runs["tp2"].final_files) == 2
    assert {e["rank"] for e in all_events(tp2, "witness_counts")} == {0, 1}
    # after training not bitwise the TP=1 run (no such claim), but its checkpoints are in the TP=1 layout
    got, want = checkpoint_files(tp2), checkpoint_files(base)
    assert {f: {k: t.shape for k, t in ts.items()} for f, ts in got.items()} == {
        f: {k: t.shape for k, t in ts.items()} for f, ts in want.items()
    }


def test_sigkill_of_a_rank_is_healed_and_bitwise_the_fault_free_run(runs, model, tmp_path):
    out = tmp_path / "kill"
    trigger = Trigger(out, cell=1, step=0, action=lambda pid: os.kill(pid, signal.SIGKILL))
    trigger.start()
    result = run_training(build_plan(TrainConfig(**BASE, cells=2, model=str(model), out=out)))
    trigger.join(timeout=5)
    assert trigger.fired is not None
    assert_analyzed_clean(result, cells=2)
    base = runs["base"].run_dir
    assert main(["compare-dumps", "--exact", str(base), str(out)]) == 0
    assert weights_sent(out) == weights_sent(base)
    (fail,) = [e for e in all_events(out, "cell_state") if e["new"] == "failed"]
    assert fail["cell"] == 1 and "died" in fail["reason"], fail
    (heal,) = all_events(out, "heal")
    assert (heal["cell"], heal["donor"]) == (1, 0) and heal["total"] == heal["donor_total"] and heal["bytes"] > 0
    assert rules(result)["FT107"] == (1, "passed")  # the heal itself was verified
    healed = {(e["step"], e["total"]) for e in all_events(out, "state_fingerprint") if e["source"]["incarnation"] == 1}
    assert healed and healed <= {(e["step"], e["total"]) for e in all_events(base, "state_fingerprint")}
    (row,) = result.analysis.recovery
    assert (row["injected"], row["kind"], row["cell"], row["recovered_by"]) == (False, "detected", 1, "reconfigure")
    assert row["samples_lost"] == 0, row


def _cli_args(model: Path, out: Path) -> list[str]:
    args = ["--model", str(model), "--out", str(out), "--cells", "2"]
    for key, value in BASE.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args


def _logged_publication(run: Path) -> bool:
    log = run / "events" / "driver-i0.jsonl"
    return log.exists() and any('"checkpoint_published"' in line for line in log.read_text().splitlines())


def test_sigkill_of_ftkit_train_then_resume_is_bitwise_the_uninterrupted_run(runs, model, tmp_path):
    run = tmp_path / "B"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ftkit", "train", *_cli_args(model, run)],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its local Ray shares the session: killed with it
    )
    try:
        deadline = time.monotonic() + 600
        # a publication the driver logged (a checkpoint committed but not yet logged when the driver
        # is killed is not trusted by the resume: its steps are trained again, docs/checkpoints.md)
        while not _logged_publication(run):
            assert proc.poll() is None, "ftkit train ended before it published a checkpoint"
            assert time.monotonic() < deadline, "no checkpoint was published"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the whole session: the driver and its Ray
        code = proc.wait(timeout=60)
    assert code == -signal.SIGKILL
    assert not (run / "status.json").exists() or json.loads((run / "status.json").read_text())["status"] != "completed"

    assert main(["train", "--resume", str(run), "--cells", "1"]) == 0  # in this process: its Ray
    (event,) = all_events(run, "run_resumed")
    assert (event["checkpoint"], event["checkpoint_step"]) == ("step_000001", 1), event
    base = runs["base"].run_dir
    for args in (["compare-dumps", "--exact", str(base), str(run)], ["analyze-events", str(run)]):
        assert main(args) == 0, args
    assert main(["verify-checkpoint", str(run)]) == 0
    status = json.loads((run / "status.json").read_text())
    assert (status["status"], status["steps_committed"]) == ("completed", ROLLOUTS * 2)


def test_a_tied_model_at_pp2_is_exit_2_naming_the_reason(tmp_path, capsys):
    tied = make_model("llama", tmp_path, eos=True)  # Llama ties its embeddings by default here
    out = tmp_path / "run"
    code = main(["train", "--model", str(tied), "--pp", "2", "--out", str(out), "--cells", "1"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("Error: ")]
    assert code == 2 and "Traceback" not in err, err
    assert len(errors) == 1 and "tied embeddings" in errors[0] and "use pp 1" in errors[0], err
    assert any(line.startswith("Hint: ") for line in err.splitlines())
    assert not out.exists()
