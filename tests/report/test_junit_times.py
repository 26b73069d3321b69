"""JUnit ``time``: each rule's seconds on its case, the work's seconds on the suite (issue 38 item 17).

Found as: a CI run of ``--junit-xml`` showed ``time="0"`` on every testcase and suite. Built the
same way: the CLI writes the file, a schema-valid parse reads the times back.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from junit_schemas import check_junit

from ftkit import cli
from ftkit.testing.synthetic import generate
from ftkit.testing.synthetic_spec import SyntheticSpec


def _run(tmp_path: Path, name: str = "run") -> Path:
    return generate(tmp_path / name, SyntheticSpec(cells=2, engines=1, rollouts=2, steps_per_rollout=2)).events_dir


def _times(path: Path) -> tuple[float, dict[str, tuple[float, bool]]]:
    """The suite's time and, by case name, (its time, whether it was skipped)."""
    suite = check_junit(path).find("testsuite")
    assert suite is not None
    cases = {
        str(tc.get("name")): (float(tc.get("time") or "nan"), tc.find("skipped") is not None)
        for tc in suite.findall("testcase")
    }
    return float(suite.get("time") or "nan"), cases


@pytest.mark.parametrize("workers", ["0", "2"])
def test_analyze_events_times_each_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: str) -> None:
    """Every rule that ran has a positive time; the suite's time (the whole analysis) covers them
    all; in one process and with worker processes alike."""
    monkeypatch.setenv("FTKIT_ANALYZE_WORKERS", workers)
    events = _run(tmp_path)
    path = tmp_path / "r.xml"
    assert cli.main(["analyze-events", str(events), "--junit-xml", str(path), "-f", "json"]) == 0
    total, cases = _times(path)
    ran = {name: t for name, (t, skipped) in cases.items() if not skipped}
    assert len(ran) >= 5
    assert all(t > 0 for t in ran.values()), ran
    assert total > 0 and round(total * 1000) >= sum(round(t * 1000) for t, _ in cases.values())


def _every_case_timed(path: Path, least: int) -> None:
    """At least ``least`` cases ran, each with a positive time; the suite's covers them all."""
    total, cases = _times(path)
    ran = {name: t for name, (t, skipped) in cases.items() if not skipped}
    assert len(ran) >= least and all(t > 0 for t in ran.values()), cases
    assert round(total * 1000) >= sum(round(t * 1000) for t, _ in cases.values())


def test_compare_runs_times_each_comparison(tmp_path: Path) -> None:
    """compare-runs: each code's case carries the seconds of its own comparisons (was 0 on every
    case); the suite's time is the whole work, reading both logs included."""
    a, b = _run(tmp_path, "a"), _run(tmp_path, "b")
    path = tmp_path / "r.xml"
    assert cli.main(["compare-runs", str(a.parent), str(b.parent), "--junit-xml", str(path), "-f", "json"]) == 0
    _every_case_timed(path, least=6)


def test_verify_checkpoint_times_each_rule(tmp_path: Path) -> None:
    """verify-checkpoint of a run written through the evidence API (checkpoints every 2 steps):
    every rule that ran has a positive time (its share of the passes that checked it)."""
    torch = pytest.importorskip("torch")
    from ftkit.evidence import EvidenceProfile, EvidenceRun

    run_dir = tmp_path / "run"
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    with EvidenceRun(run_dir, EvidenceProfile(checkpoint_every=2)) as run:
        run.allocate(0, range(6))
        for step in range(6):
            opt.zero_grad()
            model(torch.ones(1, 4)).sum().backward()
            opt.step()
            run.step(step, model=model, optimizer=opt, samples=[step], metrics={"loss": 1.0})
            if run.profile.due("checkpoint", step):
                run.publish_checkpoint(step, model, opt)
    path = tmp_path / "r.xml"
    assert cli.main(["verify-checkpoint", str(run_dir), "--junit-xml", str(path), "-f", "json"]) == 0
    _every_case_timed(path, least=12)


def test_compare_dumps_times_each_tensor(tmp_path: Path) -> None:
    """compare-dumps: one case per compared tensor, each with the seconds its load and comparison
    took; the suite covers them."""
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    tensors = {f"layer{i}.weight": rng.standard_normal((256, 256)).astype(np.float32) for i in range(4)}
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
        save_file(tensors, str(tmp_path / side / "model.safetensors"))
    path = tmp_path / "r.xml"
    assert (
        cli.main(["compare-dumps", str(tmp_path / "a"), str(tmp_path / "b"), "--junit-xml", str(path), "-f", "json"])
        == 0
    )
    total, cases = _times(path)
    timed = {name: t for name, (t, _) in cases.items() if "layer" in name}
    assert len(timed) == 4 and all(t > 0 for t in timed.values()), cases
    assert round(total * 1000) >= sum(round(t * 1000) for t, _ in cases.values())
