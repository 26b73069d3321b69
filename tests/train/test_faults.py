"""Fault injection without Ray: the --inject / --chaos grammar (good and bad specs, exit 2 through
the CLI), which process a spec strikes, once-only and attempt matching, chaos determinism,
flip_bit, and real processes: ``sigkill`` kills (with ``fault_injected`` on disk first), ``exit``
exits 1, ``hang`` stops making progress until the test kills it."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ftkit import cli
from ftkit.train.config import TrainConfig
from ftkit.train.faults.chaos import FATAL, expand_chaos, parse_chaos
from ftkit.train.faults.injector import FaultInjector, InjectedFault, flip_bit
from ftkit.train.faults.schedule import parse_specs
from ftkit.train.faults.spec import KIND_POINTS, POINTS, WRITER_POINTS, FaultSpec, parse_spec
from ftkit.train.plan.run_plan import build_plan, fault_bounds

ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- grammar
def test_the_issue_example_parses():
    s = parse_spec("kind=sigkill,point=during_reduce,cell=1,step=3")
    assert s == FaultSpec("sigkill", "during_reduce", cell=1, rank=0, step=3, attempt=0)
    assert s.role == "trainer"
    e = parse_spec(" kind = corrupt-engine , point=during_weight_sync, engine=0, step=4, attempt=1 ")
    assert (e.role, e.engine, e.cell, e.rank, e.step, e.attempt) == ("engine", 0, None, None, 4, 1)
    assert parse_spec("kind=slow,point=before_forward,cell=0,rank=1,step=0,seconds=0.25").seconds == 0.25
    assert parse_spec("kind=corrupt-transfer,point=during_heal,cell=1").step is None  # any heal
    export = parse_spec("kind=exit,point=during_weight_sync,cell=1,step=2")  # a rank exporting weights
    assert (export.role, export.cell, export.rank, export.engine) == ("trainer", 1, 0, None)
    # publish_write strikes the driver, or with cell= the rank that writes the checkpoint's files
    assert parse_spec("kind=sigkill,point=publish_write,step=1").role == "driver"
    writer = parse_spec("kind=sigkill,point=publish_write,cell=1,step=1")
    assert (writer.role, writer.cell, writer.rank) == ("trainer", 1, 0)


@st.composite
def specs_strategy(draw: st.DrawFn) -> FaultSpec:
    kind, point = draw(st.sampled_from(sorted((k, p) for k, ps in KIND_POINTS.items() for p in ps)))
    engine_ok, rank_ok = point == "during_weight_sync", kind not in ("corrupt-engine", "stale-weights")
    on_engine = engine_ok and (not rank_ok or draw(st.booleans()))
    writing_rank = point == "publish_write" and draw(st.booleans())  # rank 0 of a cell: cell=
    on_writer = point in WRITER_POINTS and not writing_rank  # the checkpoint publisher (the driver): no cell
    return FaultSpec(
        kind,
        point,
        cell=None if on_engine or on_writer else draw(st.integers(0, 63)),
        rank=None if on_engine or on_writer else 0 if writing_rank else draw(st.integers(0, 7)),
        engine=draw(st.integers(0, 15)) if on_engine else None,
        step=draw(st.none() | st.integers(0, 10**6)) if point == "during_heal" else draw(st.integers(0, 10**6)),
        attempt=draw(st.integers(0, 9)),
        seconds=draw(st.floats(0, 100, allow_nan=False)) if kind == "slow" else 1.0,
    )


@given(specs_strategy())
def test_every_spec_round_trips_through_its_text(spec):
    assert parse_spec(spec.text()) == spec


@pytest.mark.parametrize(
    "spec, message",
    [
        ("kind=boom,point=before_forward,cell=0,step=0", "kind must be one of sigkill, exit, exception, hang"),
        ("point=before_forward,cell=0,step=0", "kind must be one of"),
        ("kind=sigkill,point=nowhere,cell=0,step=0", "point for kind=sigkill must be one of before_forward"),
        ("kind=nan-grad,point=after_reduce,cell=0,step=0", "point for kind=nan-grad must be one of mid_backward"),
        ("kind=corrupt-engine,point=before_forward,cell=0,step=0", "must be one of during_weight_sync"),
        ("kind=corrupt-transfer,point=during_reduce,cell=0,step=0", "must be one of during_heal"),
        ("kind=sigkill,point=during_reduce,step=3", "give cell="),
        ("kind=sigkill,point=during_weight_sync,cell=0,engine=0,step=0", "give engine= (an engine) or cell="),
        ("kind=sigkill,point=during_weight_sync,step=0", "strikes a rank: give cell="),
        ("kind=corrupt-engine,point=during_weight_sync,cell=0,step=0", "corrupt-engine strikes an engine"),
        ("kind=stale-weights,point=during_weight_sync,cell=0,step=0", "stale-weights strikes an engine"),
        ("kind=sigkill,point=before_forward,engine=0,step=0", "engine= needs point=during_weight_sync"),
        ("kind=sigkill,point=publish_scan,cell=0,step=1", "strikes the checkpoint publisher (the driver): no cell="),
        ("kind=sigkill,point=publish_write,cell=0,rank=1,step=1", "strikes the rank that writes the files"),
        ("kind=sigkill,point=before_forward,cell=0", "step= is required for point=before_forward"),
        ("kind=sigkill,point=before_forward,cell=-1,step=0", "cell must be an integer >= 0, not '-1'"),
        ("kind=sigkill,point=before_forward,cell=0,step=x", "step must be an integer >= 0, not 'x'"),
        ("kind=sigkill,point=before_forward,cell=0,step=0,seconds=2", "seconds applies to kind=slow only"),
        ("kind=slow,point=before_forward,cell=0,step=0,seconds=nan", "seconds must be a number >= 0"),
        ("kind=sigkill,point=before_forward,cell=0,step=0,colour=red", "unknown key 'colour' (keys: kind, point"),
        ("kind=sigkill,kind=exit,point=before_forward,cell=0,step=0", "kind given twice"),
        ("kind=sigkill,,point=before_forward", "'' is not key=value"),
    ],
)
def test_bad_specs_are_one_line_errors_naming_the_key(spec, message):
    with pytest.raises(ValueError) as err:
        parse_spec(spec)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert repr(spec) in str(err.value)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("kind=sigkill,point=before_forward,cell=2,step=0", "cell must be below 2 for this config, not 2"),
        ("kind=sigkill,point=before_forward,cell=0,rank=1,step=0", "rank must be below 1"),
        ("kind=sigkill,point=during_weight_sync,engine=1,step=0", "engine must be below 1"),
        ("kind=sigkill,point=before_forward,cell=0,step=16", "step must be below 16"),
        ("kind=corrupt-engine,point=during_weight_sync,engine=0,step=3", "step must be one of them"),
        ("kind=sigkill,point=during_weight_sync,engine=0,step=18", "step must be below 17"),
    ],
)
def test_specs_are_bounded_by_the_config(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_spec(spec, fault_bounds(TrainConfig()))  # 2 cells x 1 rank, 1 engine, 8 rollouts x 2 steps
    final_sync = parse_spec("kind=sigkill,point=during_weight_sync,engine=0,step=16", fault_bounds(TrainConfig()))
    assert final_sync.step == 16  # the final weights (version 8)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--inject", "kind=boom,point=before_forward,cell=0,step=0"], "inject spec"),
        (["--inject", "kind=sigkill,point=before_forward,cell=5,step=0"], "cell must be below 2"),
        (["--chaos", "mtbf=-1"], "chaos spec 'mtbf=-1': mtbf must be a number > 0"),
        (["--chaos", "seed=1"], "mtbf= (mean seconds between faults) is required"),
        (["--chaos", "mtbf=1,max=0"], "max must be an integer >= 1"),
        (["--chaos", "mtbf=1,speed=3"], "'speed=3' is not one of mtbf=, seed=, max=, step_s="),
    ],
)
def test_bad_specs_exit_2_through_the_cli(capsys, tmp_path, args, message):
    code = cli.main(["train", "--out", str(tmp_path / "run"), *args])
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("Error: ")]
    assert code == 2 and out == "" and "Traceback" not in err
    assert len(errors) == 1 and message in errors[0]
    assert any(line.startswith("Hint: ") for line in err.splitlines())
    assert not (tmp_path / "run").exists()


def test_specs_travel_in_the_config_file(capsys, tmp_path):
    (tmp_path / "faults.toml").write_text(
        'inject = ["kind=exit,point=after_reduce,cell=1,step=2"]\nchaos = "mtbf=6,seed=3,max=2"\n'
    )
    code = cli.main(["train", "--config", str(tmp_path / "faults.toml"), "--print-config"])
    cfg = TrainConfig.model_validate(json.loads(capsys.readouterr().out))
    assert code == 0 and cfg.faults.inject == ("kind=exit,point=after_reduce,cell=1,step=2",)
    specs = build_plan(cfg).faults
    assert specs[0] == FaultSpec("exit", "after_reduce", cell=1, rank=0, step=2) and len(specs) == 3


# ----------------------------------------------------------------------------- matching
class Log:
    """Stands in for EventWriter: records emits and syncs in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, object]]] = []

    def emit(self, type: str, **fields: object) -> bool:
        self.calls.append((type, fields))
        return True

    def sync(self) -> None:
        self.calls.append(("sync", {}))


def _injector(specs, role="trainer", **who):
    log = Log()
    return FaultInjector([parse_spec(s) for s in specs], log, role, **who), log


def test_a_spec_strikes_only_its_process_point_step_and_attempt():
    specs = ["kind=nan-grad,point=mid_backward,cell=1,rank=1,step=3,attempt=1"]
    for role, who in [("trainer", dict(cell=0, rank=1)), ("trainer", dict(cell=1, rank=0)), ("engine", dict(engine=0))]:
        inj, _ = _injector(specs, role, **who)
        assert inj.armed == [] and inj.at("mid_backward", step=3, attempt=1) is None
    inj, log = _injector(specs, cell=1, rank=1)
    assert inj.at("before_reduce", step=3, attempt=1) is None
    assert inj.at("mid_backward", step=2, attempt=1) is None
    assert inj.at("mid_backward", step=3, attempt=0) is None
    assert log.calls == []
    assert inj.at("mid_backward", step=3, attempt=1, rollout=1) == "nan-grad"
    assert inj.at("mid_backward", step=3, attempt=1) is None  # once per process incarnation
    assert log.calls == [
        (
            "fault_injected",
            dict(kind="nan-grad", point="mid_backward", cell=1, rank=1, rollout=1, step=3, attempt=1, engine=None),
        ),
        ("sync", {}),
    ]


def test_engine_specs_strike_their_engine():
    inj, log = _injector(["kind=corrupt-engine,point=during_weight_sync,engine=1,step=2"], "engine", engine=1)
    assert (
        _injector(["kind=corrupt-engine,point=during_weight_sync,engine=1,step=2"], "engine", engine=0)[0].armed == []
    )
    assert inj.at("during_weight_sync", step=2, rollout=1) == "corrupt-engine"
    assert log.calls[0][1]["engine"] == 1 and log.calls[0][1]["cell"] is None


def test_a_step_less_heal_spec_strikes_the_first_heal_of_each_attempt_it_names():
    inj, _ = _injector(["kind=corrupt-transfer,point=during_heal,cell=0"], cell=0, rank=0)
    assert inj.at("during_heal", step=7, attempt=0) == "corrupt-transfer"
    assert inj.at("during_heal", step=7, attempt=0) is None


def test_exception_is_logged_then_raised():
    inj, log = _injector(["kind=exception,point=before_reduce,cell=0,step=1"], cell=0, rank=0)
    with pytest.raises(InjectedFault, match="kind=exception,point=before_reduce,cell=0,rank=0,step=1"):
        inj.at("before_reduce", step=1)
    assert [c[0] for c in log.calls] == ["fault_injected", "sync"]
    assert isinstance(InjectedFault("x"), RuntimeError)


def test_slow_sleeps_its_seconds_and_returns_none(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    inj, log = _injector(["kind=slow,point=during_reduce,cell=0,step=0,seconds=2.5"], cell=0, rank=0)
    assert inj.at("during_reduce", step=0) is None
    assert slept == [2.5] and log.calls[0][1]["kind"] == "slow"


def test_parse_specs_puts_chaos_after_the_explicit_specs():
    cfg = fault_bounds(TrainConfig(rollouts=20))
    specs = parse_specs(["kind=exit,point=after_reduce,cell=1,step=2"], "mtbf=4,seed=1,max=5", cfg)
    assert specs[0].kind == "exit" and len(specs) == 6
    assert parse_specs([], "mtbf=4", None) == []  # grammar only without a config


# ----------------------------------------------------------------------------- chaos
def test_chaos_is_deterministic_and_bounded():
    cfg = fault_bounds(TrainConfig(cells=3, micro_shards=8, rollouts=40, engines=2))
    a = expand_chaos("mtbf=3,seed=7,max=12", cfg)
    assert a == expand_chaos("mtbf=3,seed=7,max=12", cfg)
    assert a != expand_chaos("mtbf=3,seed=8,max=12", cfg)
    assert len(a) == 12
    steps = [s.step for s in a]
    assert steps == sorted(set(steps)) and steps[0] >= 1 and steps[-1] < 80
    for s in a:
        assert parse_spec(s.text(), cfg) == s  # every drawn spec is valid for the run
        assert s.attempt == 0 and s.kind != "corrupt-engine"
        if s.kind in FATAL and s.role == "trainer":
            assert s.cell != 0  # cell 0 always survives
    few = expand_chaos("mtbf=1000,seed=7,max=12", cfg)
    assert len(few) < 3  # a long mtbf over 80 steps of ~2 s


def test_chaos_on_one_cell_draws_no_fatal_trainer_fault():
    specs = expand_chaos("mtbf=2,seed=0,max=50", fault_bounds(TrainConfig(cells=1, rollouts=30)))
    assert specs and all(s.kind in ("nan-grad", "slow") for s in specs if s.role == "trainer")


def test_chaos_mean_gap_follows_mtbf_over_step_s():
    cfg = fault_bounds(TrainConfig(rollouts=2000))
    specs = expand_chaos("mtbf=10,step_s=1,seed=1,max=400", cfg)
    gaps = [b.step - a.step for a, b in zip(specs, specs[1:])]
    assert 8 < sum(gaps) / len(gaps) < 12
    assert parse_chaos("mtbf=10,step_s=1,seed=1,max=400").step_s == 1


# ----------------------------------------------------------------------------- flip_bit
def test_flip_bit_changes_one_bit_in_place():
    t = torch.linspace(-1, 1, 12, dtype=torch.float32).reshape(3, 4)
    before = t.clone()
    flip_bit(t, 5)
    diff = (t.view(torch.int32) ^ before.view(torch.int32)).reshape(-1)
    assert diff.tolist() == [0] * 5 + [1] + [0] * 6
    assert torch.isfinite(t).all() and math.isclose(t[1, 1].item(), before[1, 1].item(), rel_tol=1e-6)
    flip_bit(t, 5)
    assert torch.equal(t, before)
    ints = torch.arange(4)
    flip_bit(ints, -1)
    assert ints.tolist() == [0, 1, 2, 2]


def test_flip_bit_refuses_what_it_cannot_do_in_place():
    with pytest.raises(ValueError, match="contiguous"):
        flip_bit(torch.zeros(4, 4).t())
    with pytest.raises(IndexError):
        flip_bit(torch.zeros(3), 3)


# ----------------------------------------------------------------------------- real processes
SCRIPT = """
import sys
from ftkit.events.writer import EventWriter
from ftkit.train.faults.injector import FaultInjector
from ftkit.train.faults.spec import parse_spec
w = EventWriter(sys.argv[1], run="t", role="trainer", cell=1, rank=0)
inj = FaultInjector([parse_spec(sys.argv[2])], w, "trainer", cell=1, rank=0)
inj.at("before_forward", step=0)
print("survived", flush=True)
inj.at("during_reduce", step=3, rollout=1)
print("after", flush=True)
"""


def _start(tmp_path: Path, spec: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), str(tmp_path), spec],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _events(tmp_path: Path) -> list[dict[str, object]]:
    (f,) = tmp_path.glob("trainer-c1-r0-i*.jsonl")
    return [json.loads(line) for line in f.read_text().splitlines()]


@pytest.mark.parametrize("kind, returncode", [("sigkill", -signal.SIGKILL), ("exit", 1)])
def test_process_ending_faults_really_end_the_process_after_logging(tmp_path, kind, returncode):
    proc = _start(tmp_path, f"kind={kind},point=during_reduce,cell=1,step=3")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == returncode, err
    assert out.split() == ["survived"]
    (ev,) = _events(tmp_path)
    assert (ev["type"], ev["kind"], ev["point"], ev["step"], ev["rollout"], ev["cell"]) == (
        "fault_injected",
        kind,
        "during_reduce",
        3,
        1,
        1,
    )


def test_hang_stops_making_progress_until_killed(tmp_path):
    proc = _start(tmp_path, "kind=hang,point=during_reduce,cell=1,step=3")
    try:
        for _ in range(1200):  # the injection is logged before the hang starts
            if list(tmp_path.glob("*.jsonl")) and _events(tmp_path):
                break
            time.sleep(0.1)
        assert _events(tmp_path)[0]["kind"] == "hang"
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=3)
        assert proc.poll() is None
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
    assert out.split() == ["survived"] and proc.returncode == -signal.SIGKILL


def test_every_point_is_documented():
    doc = (ROOT / "docs" / "fault-injection.md").read_text()
    for name in (*POINTS, *KIND_POINTS):
        assert f"`{name}`" in doc
