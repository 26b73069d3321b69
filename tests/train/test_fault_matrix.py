"""Acceptance of fault tolerance (issue 7): ``ftkit train`` run as a user (a subprocess) with
real faults, and its artefacts checked, not its log grepped for words.

For every faulted run: ``ftkit train`` exits 0, the injected faults are in the log (written
before they fired), ``ftkit analyze-events`` exits 0 and its recovery table lists every fault
recovered with no sample lost, ``ftkit compare-dumps --exact`` against the fault-free run of the
same seed exits 0 (final state, rollouts, dumps), and every engine loaded the fault-free run's
weights for every version. Exceptions: ``corrupt-engine`` must end in exit 1 with FT102; the
last cell dying ends in a clean failure (exit 1, one ``Error:`` line, status ``failed``, no
actor process left).

One fault-free reference run (2 cells) serves every test of the module: the design's
membership invariance (I3) makes a 3-cell or a 1-cell run of the same seed end bitwise equal
to it too. CI runs a representative subset (marked slow): a rank killed mid-reduce, a NaN
gradient and an engine killed in one run, and a corrupt engine (``tests/train/test_fault_tolerance.py``
adds an outside SIGKILL, a SIGSTOP hang, SIGTERM and the last cell dying); the full suite
(``FTKIT_FULL_TESTS=1``, ``tests/suite.py``) adds the scenarios marked ``full`` here, every kind
at every point and a long chaos soak (>= 10 faults).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faultkit import still_alive

from ftkit.train.faults.spec import KIND_POINTS, TRAINER_POINTS, WRITER_POINTS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# 3 rollouts x 2 steps of 16 samples in 4 micro-shards, every rollout dumped.
CONFIG = (
    "--rollouts", "3", "--samples-per-rollout", "16", "--micro-shards", "4", "--group-size", "4",
    "--reward", "deterministic_random", "--dump-rollouts", "all", "--seed", "3",
)  # fmt: skip
# Deadlines that keep a hang cheap to detect while a loaded 2-core machine sees no false failure.
QUICK = ("--step-timeout", "30", "--heal-timeout", "60")
RUN_TIMEOUT = 900


def ftkit(*args: str, timeout: float = RUN_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """``ftkit ARGS`` as a user runs it (this checkout on PYTHONPATH)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "ftkit", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def train(out: Path, *extra: str, cells: int = 2) -> subprocess.CompletedProcess[str]:
    return ftkit("train", "--out", str(out), "--cells", str(cells), *CONFIG, *extra, "--format", "json")


def events(run: Path) -> list[dict[str, Any]]:
    found = []
    for f in sorted((run / "events").glob("*.jsonl")):
        found += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return found


def engine_weights(run: Path) -> dict[int, set[str]]:
    """Version -> the fingerprints engines reported loading (every incarnation of every engine)."""
    seen: dict[int, set[str]] = {}
    for e in events(run):
        if e["type"] == "engine_weights":
            seen.setdefault(e["version"], set()).add(e["total"])
    return seen


def analyze(run: Path) -> tuple[int, dict[str, Any]]:
    res = ftkit("analyze-events", str(run / "events"), "--format", "json")
    assert res.returncode in (0, 1), res.stderr[-2000:]
    return res.returncode, json.loads(res.stdout)


def explain(res: subprocess.CompletedProcess[str]) -> str:
    """Why a run failed: its stderr, and the analyzer's findings from its JSON report."""
    try:
        report = json.loads(res.stdout).get("analysis", {})
        findings = [f"{f['code']}: {f['message']}" for f in report.get("findings", [])]
    except (ValueError, AttributeError):
        findings = [res.stdout[-2000:]]
    return f"exit {res.returncode}\n--- stderr (tail) ---\n{res.stderr[-3000:]}\n--- findings ---\n" + "\n".join(
        findings[:10]
    )


def assert_survived(
    run: Path, res: subprocess.CompletedProcess[str], reference: Path, faults: int, detected: int = 0
) -> None:
    """The three acceptance checks (plus the engines' weights) of a run that must survive:
    ``faults`` injected, ``detected`` failures nobody injected (rows of their own)."""
    assert res.returncode == 0, explain(res)
    injected = [e for e in events(run) if e["type"] == "fault_injected"]
    assert len(injected) >= faults, f"{len(injected)} fault(s) fired, expected {faults}"
    code, report = analyze(run)
    assert code == 0, json.dumps(report["findings"], indent=1)[:4000]
    assert report["stats"]["status"] == "completed"
    rows = report["recovery"]
    assert len([r for r in rows if r["injected"]]) == len(injected), rows
    assert len([r for r in rows if not r["injected"]]) == detected, rows
    for row in rows:
        assert row["samples_lost"] == 0 or (row["rollout"] is None and row["samples_lost"] is None), row
        assert row["recovered_by"] is not None or row["kind"] == "slow", row
    compare = ftkit("compare-dumps", "--exact", str(run), str(reference), "--format", "json")
    assert compare.returncode == 0, compare.stdout[-4000:] + compare.stderr[-2000:]
    assert json.loads(compare.stdout)["stats"]["differ"] == 0
    want = engine_weights(reference)
    got = engine_weights(run)
    assert got == want, "engines loaded other weights than the fault-free run's"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fault-free run of the seed every test compares with."""
    run = tmp_path_factory.mktemp("faults") / "reference"
    res = train(run)
    assert res.returncode == 0, explain(res)
    assert not [e for e in events(run) if e["type"] == "fault_injected"]
    return run


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "run"


def specs(*texts: str) -> list[str]:
    return [a for t in texts for a in ("--inject", t)]


def heal_room(cell: int = 0, steps: tuple[int, ...] = (2, 3, 4, 5), seconds: int = 12) -> list[str]:
    """``slow`` faults that hold the survivor ``cell`` at the start of ``steps``: a restarted
    cell needs tens of seconds (imports) on a loaded machine, longer than this 6-step run
    lasts, and a test of a heal needs the heal to happen. Longer than the collective timeout
    (10 s), so each one is recovered whatever the timing: before the heal, by the healed
    cell's rejoining ``reconfigure``; after it, the healed cell's collective times out and the
    attempt is discarded and retried. (The analyzer flags a ``slow`` fault that caused
    nothing as FT113.)"""
    return [f"kind=slow,point=before_forward,cell={cell},step={s},seconds={seconds}" for s in steps]


# ----------------------------------------------------------------------------- representative (CI)
def test_rank_killed_mid_reduce_nan_gradient_and_engine_killed(reference: Path, out: Path) -> None:
    res = train(
        out,
        *specs(
            "kind=sigkill,point=during_reduce,cell=1,step=1",
            "kind=nan-grad,point=mid_backward,cell=0,step=3",
            "kind=sigkill,point=during_weight_sync,engine=0,step=4",
        ),
    )
    assert_survived(out, res, reference, faults=3)
    outcomes = {(e["step"], e["attempt"], e["outcome"]) for e in events(out) if e["type"] == "step_outcome"}
    assert (3, 1, "committed") in outcomes and (3, 0, "committed") not in outcomes  # nan-grad: discarded, retried
    # the replaced engine logged why it was started, and the analyzer counts it
    restarts = [e for e in events(out) if e["type"] == "engine_restart"]
    assert [(e["engine"], e["during"]) for e in restarts] == [(0, "load")] and restarts[0]["cause"], restarts
    assert analyze(out)[1]["stats"]["engine_restarts"] == 1


@pytest.mark.full
def test_hung_rank_is_detected_and_a_corrupt_heal_rejected(reference: Path, out: Path) -> None:
    """A rank hangs (the step deadline catches it); its cell is restarted and its first heal
    gets one bit flipped: the heal is rejected, retried, and accepted with equal fingerprints."""
    res = train(
        out,
        *QUICK,
        *specs(
            "kind=hang,point=before_forward,cell=1,step=1",
            "kind=corrupt-transfer,point=during_heal,cell=1",
            *heal_room(),
        ),
    )
    assert_survived(out, res, reference, faults=2 + 4)
    evs = events(out)
    t = next(e["time"] for e in evs if e["type"] == "fault_injected" and e["kind"] == "corrupt-transfer")
    moves = [(e["old"], e["new"]) for e in evs if e["type"] == "cell_state" and e["cell"] == 1 and e["time"] >= t]
    assert moves[:3] == [("healing", "restarting"), ("restarting", "healing"), ("healing", "alive")], moves
    heals = [e for e in evs if e["type"] == "heal" and e["cell"] == 1 and e["time"] >= t]
    assert len(heals) == 1 and heals[0]["total"] == heals[0]["donor_total"]  # only the verified heal is logged


def test_corrupt_engine_is_reported_not_hidden(reference: Path, out: Path) -> None:
    res = train(out, *specs("kind=corrupt-engine,point=during_weight_sync,engine=0,step=2"))
    assert res.returncode == 1, explain(res)
    code, report = analyze(out)
    assert code == 1 and {f["code"] for f in report["findings"]} >= {"FT102"}
    assert "Traceback" not in res.stderr


@pytest.mark.full
def test_rank_killed_by_someone_else(reference: Path, out: Path) -> None:
    """A fault ftkit did not inject: this test SIGKILLs rank 0 of cell 1 (its pid from the
    events) once the cell has committed a step."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    args = ["train", "--out", str(out), "--cells", "2", *CONFIG, "--format", "json"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ftkit", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        victim = _wait_for_commit(out, cell=1, step=1, proc=proc)
        os.kill(victim, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    res = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert_survived(out, res, reference, faults=0, detected=1)
    failed = [e for e in events(out) if e["type"] == "cell_state" and e["cell"] == 1 and e["new"] == "failed"]
    assert failed, "the driver did not record the death of cell 1"


def _wait_for_commit(run: Path, cell: int, step: int, proc: subprocess.Popen[str]) -> int:
    """The pid of rank 0 of ``cell`` once it logged a committed ``step``."""
    path = run / "events" / f"trainer-c{cell}-r0-i0.jsonl"
    deadline = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before the kill"
        if path.exists():
            for line in path.read_text().splitlines():
                ev = json.loads(line) if line.endswith("}") else {}
                if ev.get("type") == "step_outcome" and ev["step"] == step and ev["outcome"] == "committed":
                    return int(ev["source"]["pid"])
        time.sleep(0.05)
    raise AssertionError(f"cell {cell} never committed step {step}")


@pytest.mark.full
def test_two_cells_die_in_one_step_one_survives(reference: Path, out: Path) -> None:
    """Cells 0 (the first live cell: exports weights, writes replicated dumps) and 2 die in
    the same step; with --min-cells 1 cell 1 carries on alone, then the others are healed."""
    res = train(
        out,
        "--min-cells",
        "1",
        # Both points come before the step's collective, so neither fault can pre-empt the other.
        *specs("kind=exception,point=before_reduce,cell=0,step=2", "kind=exit,point=before_forward,cell=2,step=2"),
        cells=3,
    )
    assert_survived(out, res, reference, faults=2)
    alive = [e["alive_after"] for e in events(out) if e["type"] == "reconfigure"]
    assert [1] in alive


@pytest.mark.full
def test_two_recipients_heal_from_two_donors_in_parallel(reference: Path, out: Path) -> None:
    """Cells 1 and 2 of 4 die in step 4 (the last but one). Their restarts start together once
    cells 0 and 3 committed the retry, and the boundary before the last step waits for both, so
    one heal round serves them: each from its own donor, the two transfers at the same time."""
    res = train(
        out,
        *QUICK,
        *specs("kind=sigkill,point=before_forward,cell=1,step=4", "kind=sigkill,point=before_forward,cell=2,step=4"),
        cells=4,
    )
    assert_survived(out, res, reference, faults=2)
    heals: dict[int, list[dict[str, Any]]] = {}
    for e in events(out):
        if e["type"] == "heal":
            heals.setdefault(e["cell"], []).append(e)  # one event per rank of the healed cell
    assert sorted(heals) == [1, 2], heals
    donors = {cell: {e["donor"] for e in evs} for cell, evs in heals.items()}
    assert donors[1] | donors[2] == {0, 3} and not donors[1] & donors[2], donors
    # [start, end] of each heal: its event is written at the end, ``seconds["total"]`` after its start
    spans = {cell: (min(e["time"] - e["seconds"]["total"] for e in evs), max(e["time"] for e in evs))
             for cell, evs in heals.items()}  # fmt: skip
    assert max(s for s, _ in spans.values()) < min(e for _, e in spans.values()), (
        f"heals ran one after the other: {spans}"
    )
    assert {e["epoch"] for evs in heals.values() for e in evs} == {max(e["epoch"] for e in heals[1])}
    alive = [e["alive_after"] for e in events(out) if e["type"] == "reconfigure"]
    assert alive[-1] == [0, 1, 2, 3], alive


@pytest.mark.full
def test_last_cell_dying_is_a_clean_failure(out: Path) -> None:
    res = train(out, *specs("kind=sigkill,point=before_forward,cell=0,step=1"), cells=1)
    assert res.returncode == 1, explain(res)
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and "Traceback" not in res.stderr and "bug" not in res.stderr.lower()
    evs = events(out)
    finished = [e for e in evs if e["type"] == "run_finished"]
    assert len(finished) == 1 and finished[0]["status"] == "failed" and finished[0]["reason"]
    assert json.loads((out / "status.json").read_text())["status"] == "failed"
    _assert_actors_gone(evs)


def _assert_actors_gone(evs: list[dict[str, Any]]) -> None:
    """No process that wrote to the run's log (ranks, engines) outlives ``ftkit train``."""
    pids = {e["source"]["pid"] for e in evs if e["source"]["role"] in ("trainer", "engine")}
    alive = still_alive(pids, 60)  # Ray reaps its workers asynchronously
    assert not alive, f"actor processes {sorted(alive)} outlived the run"


@pytest.mark.full
def test_short_chaos_run(reference: Path, out: Path) -> None:
    res = train(out, *QUICK, "--chaos", "mtbf=2,seed=5,max=3", cells=3)
    assert_survived(out, res, reference, faults=3)


# ----------------------------------------------------------------------------- full matrix
def _matrix() -> Iterator[Any]:
    """Every kind at every point where it applies, striking cell 1 (or engine 0) at step 1
    (rollout 0), at the heal of cell 1 after a SIGKILL at step 1, or at the first checkpoint
    publication (step 1: rank 0 of cell 1 in its preflight, the writer in the other phases).
    ``sigkill``, ``exit`` and ``hang`` at a writer phase strike ``ftkit train`` itself: a killed
    writer is ``tests/checkpoint/test_resume.py``'s (kill, then ``--resume``), a hung one is
    not protected (docs/faults.md)."""
    for kind, points in KIND_POINTS.items():
        for point in points:
            if kind in ("corrupt-engine", "corrupt-transfer"):
                continue  # their own tests above
            if point in WRITER_POINTS and kind in ("sigkill", "exit", "hang"):
                continue
            if point in TRAINER_POINTS or point in ("during_dump_write", "publish_preflight"):
                cases = [[f"kind={kind},point={point},cell=1,step=1"]]
            elif point in WRITER_POINTS:
                cases = [[f"kind={kind},point={point},step=1"]]
            elif point == "during_weight_sync":
                cases = [[f"kind={kind},point={point},engine=0,step=2"], [f"kind={kind},point={point},cell=0,step=2"]]
            else:  # during_heal
                cases = [["kind=sigkill,point=before_forward,cell=1,step=1", f"kind={kind},point={point},cell=1"]]
                cases[0] += heal_room()
            for case in cases:
                name = "+".join(s.split(",")[0][5:] + "@" + s.split(",")[1][6:] for s in case[:2])
                if point == "during_weight_sync":
                    name += "-engine" if "engine=" in case[0] else "-rank"
                yield pytest.param(case, id=name)


@pytest.mark.full
@pytest.mark.parametrize("inject", list(_matrix()))
def test_full_matrix(reference: Path, out: Path, inject: list[str]) -> None:
    res = train(out, *QUICK, *specs(*inject))
    assert_survived(out, res, reference, faults=len(inject))
    kind, point = (inject[0].split(",")[i].split("=")[1] for i in (0, 1))
    if kind in ("exception", "enospc") and point in ("publish_write", "publish_scan", "publish_manifest"):
        rejected = [e for e in events(out) if e["type"] == "checkpoint_rejected"]
        assert [e["step"] for e in rejected] == [1], "the faulted publication was not rejected"


@pytest.mark.full
def test_cell_dies_while_another_heals(reference: Path, out: Path) -> None:
    """Cell 1 dies at step 1 and is restarted (its heal slowed 8 s in during_heal); cell 2 dies
    at step 2, while cell 1 is still on its way back (restarting or healing: a restart takes
    seconds, step 2 starts right after step 1's retry commits). Cell 0 carries on; both are
    healed, and the run equals the fault-free one. (The ``slow`` room for the heals starts at
    step 3: a survivor held 12 s in the step where another cell dies outlasts the deadline the
    others get once a death is seen, and is failed too.)"""
    res = train(
        out,
        *QUICK,
        *specs(
            "kind=sigkill,point=during_reduce,cell=1,step=1",
            "kind=slow,point=during_heal,cell=1,seconds=8",
            "kind=sigkill,point=before_forward,cell=2,step=2",
            *heal_room(steps=(3, 4, 5)),
        ),
        cells=3,
    )
    assert_survived(out, res, reference, faults=3 + 3)
    moves = [(e["time"], e["cell"], e["new"]) for e in events(out) if e["type"] == "cell_state"]
    t1_failed = min(t for t, c, new in moves if c == 1 and new == "failed")
    t1_back = min(t for t, c, new in moves if c == 1 and new == "alive" and t > t1_failed)
    t2_failed = min(t for t, c, new in moves if c == 2 and new == "failed")
    assert t1_failed < t2_failed < t1_back, "cell 2 did not die while cell 1 was restarting or healing"
    assert {c for t, c, new in moves if new == "alive" and t > t2_failed} >= {1, 2}


@pytest.mark.full
def test_recipient_dies_during_its_heal(reference: Path, out: Path) -> None:
    """The restarted cell 1 dies as its heal starts (before it connects to its donor): Ray's
    death notice fails it at once and calls the donor off, so training goes on within the bound
    of a kill during a step, not after the donor's --collective-timeout (10 s) in accept."""
    res = train(
        out,
        *QUICK,
        *specs(
            "kind=sigkill,point=before_forward,cell=1,step=1", "kind=sigkill,point=during_heal,cell=1", *heal_room()
        ),
        cells=3,
    )
    assert_survived(out, res, reference, faults=2 + 4)
    evs = events(out)
    died = min(
        e["time"] for e in evs if e["type"] == "cell_state" and e["cell"] == 1 and "heal from donor" in e["reason"]
    )
    resumed = min(
        e["time"] for e in evs if e["type"] == "step_outcome" and e["outcome"] == "committed" and e["time"] > died
    )
    timeout = json.loads((out / "run.json").read_text())["config"]["collective_timeout"]
    assert resumed - died < timeout, f"the survivors stood still {resumed - died:.1f}s after the recipient died"


@pytest.mark.full
def test_chaos_soak(tmp_path: Path) -> None:
    """At least 10 faults in one run of 3 cells over 16 rollouts (32 steps; chaos draws 18,
    of which those striking a cell still being restarted do not fire), clean and bitwise
    equal to a fault-free run of its own config."""
    long = ("--rollouts", "16")
    ref = tmp_path / "ref16"
    assert (res := train(ref, *long)).returncode == 0, explain(res)
    run = tmp_path / "soak"
    res = train(run, *long, *QUICK, "--chaos", "mtbf=2,seed=11,max=25", cells=3)
    assert_survived(run, res, ref, faults=10)
