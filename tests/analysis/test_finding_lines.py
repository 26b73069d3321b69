"""Finding lines a user can act on (issue 38 item 16). FT101: one divergence that persists is one
finding (its first step, its last, how many steps), not one per step; a divergence that heals and
comes back is two. FT103 / FT104 name the ids and their counts in the line, not only in JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ftkit.analysis.engine import analyze_paths
from ftkit.tensors.fingerprint import state_total
from ftkit.testing.synthetic import generate
from ftkit.testing.synthetic_spec import SyntheticSpec


@pytest.fixture
def run(tmp_path: Path) -> Path:
    spec = SyntheticSpec(cells=3, faults=0, tensors=4, rollouts=3, engines=1, steps_per_rollout=4)
    return generate(tmp_path / "run", spec).events_dir


def _diverge(events: Path, steps: set[int]) -> None:
    """Cell 1's rank-0 fingerprints of ``steps`` changed in one tensor (its total recomputed)."""
    for path in sorted(events.glob("trainer-c1-*.jsonl")):
        out = []
        for line in path.read_text().splitlines():
            ev = json.loads(line)
            if ev["type"] == "state_fingerprint" and ev["step"] in steps:
                ev["params"][sorted(ev["params"])[0]] = "0" * 32
                ev["total"] = state_total(ev["params"], ev["optimizer"])
            out.append(json.dumps(ev))
        path.write_text("\n".join(out) + "\n")


def _ft101(events: Path) -> list:
    return [f for f in analyze_paths([events]).findings if f.code == "FT101"]


def test_a_persisting_divergence_is_one_finding(run: Path) -> None:
    _diverge(run, set(range(5, 12)))
    (f,) = _ft101(run)
    assert f.evidence["step"] == 5 and f.evidence["last_step"] == 11 and f.evidence["steps"] == 7
    assert f.message.startswith("replica divergence at step 5 ") and "through step 11 (7 steps)" in f.message
    assert f.evidence["cells"] == [1]


def test_a_divergence_that_comes_back_is_two_findings(run: Path) -> None:
    _diverge(run, {2, 3, 8})
    found = _ft101(run)
    assert [(f.evidence["step"], f.evidence["last_step"], f.evidence["steps"]) for f in found] == [(2, 3, 2), (8, 8, 1)]
    assert "through step" not in found[1].message


@pytest.mark.parametrize("code", ["FT103", "FT104"])
def test_witness_lines_name_the_ids_and_their_counts(tmp_path: Path, code: str) -> None:
    spec = SyntheticSpec(cells=2, faults=0, tensors=4, rollouts=2, engines=1, violation=code)
    events = generate(tmp_path / "run", spec).events_dir
    (f,) = [f for f in analyze_paths([events]).findings if f.code == code]
    first = f.evidence["ids"][0]
    assert f"ids {first['id']} (counted {first['counted']} of {first['expected']})" in f.message
    assert "committed step(s)" in f.message
    # an ftkit train log: the hint names its internals, not a DDP job's data loading (the evidence
    # API's wording: tests/evidence/test_api_messages.py)
    assert "micro-shard" in f.fix and "sampler" not in f.fix
