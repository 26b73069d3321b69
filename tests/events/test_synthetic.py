"""The synthetic run generator: deterministic, realistic, and usable from the command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ftkit.testing.synthetic import generate, main
from ftkit.testing.synthetic_spec import SyntheticSpec, tensor_names


def _contents(d):
    return {p.name: p.read_bytes() for p in sorted((d / "events").iterdir())}


def test_deterministic_for_a_seed(tmp_path):
    spec = dict(cells=3, tp=2, pp=2, rollouts=2, faults=2, seed=7)
    generate(tmp_path / "a", SyntheticSpec(**spec))
    generate(tmp_path / "b", SyntheticSpec(**spec))
    generate(tmp_path / "c", SyntheticSpec(**{**spec, "seed": 8}))
    assert _contents(tmp_path / "a") == _contents(tmp_path / "b") != _contents(tmp_path / "c")


def test_layout_faults_and_heals(tmp_path):
    run = generate(tmp_path, SyntheticSpec(cells=4, tp=2, pp=2, engines=2, rollouts=3, faults=2, tensors=100))
    names = sorted(p.name for p in run.events_dir.iterdir())
    assert "driver-i0.jsonl" in names and "engine-r1-i0.jsonl" in names
    assert sum(n.startswith("trainer-") and n.endswith("-i0.jsonl") for n in names) == 16
    assert any(n.endswith("-i1.jsonl") for n in names)  # a healed cell's new incarnation
    assert len(run.fault_steps) == 2
    fp = next(
        json.loads(line) for line in (run.events_dir / "trainer-c0-r0-i0.jsonl").open() if '"state_fingerprint"' in line
    )
    assert len(fp["params"]) == 50 and set(fp["params"]) == set(fp["optimizer"])  # 100 tensors over pp=2
    assert len(tensor_names(100)) == len(set(tensor_names(100))) == 100


def test_impossible_injection_is_refused(tmp_path):
    with pytest.raises(ValueError, match="FT101"):
        generate(tmp_path / "a", SyntheticSpec(cells=1, violation="FT101"))
    with pytest.raises(ValueError, match="unknown violation"):
        generate(tmp_path / "b", SyntheticSpec(violation="FT999"))


def test_module_cli(tmp_path, capsys):
    assert main([str(tmp_path), "--cells", "2", "--rollouts", "1", "--faults", "0", "--seed", "3"]) == 0
    assert "wrote" in capsys.readouterr().out and (tmp_path / "events" / "driver-i0.jsonl").exists()
    with pytest.raises(SystemExit):
        main([str(tmp_path)])  # refuses a non-empty events/
    out = tmp_path / "sub"
    proc = subprocess.run(
        [sys.executable, "-m", "ftkit.testing.synthetic", str(out), "--violation", "FT109"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and any((out / "events").iterdir())
