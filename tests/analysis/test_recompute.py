"""Recompute, never trust (issue 26, items 1-4): evidence is demanded up to a declared death, every
fingerprint total is recomputed from its per-tensor parts, and an event's ``cell`` / ``rank`` /
``engine`` must be its writer's. Each test tampers with a synthetic run the way the issue's
fuzzer tampered with real ones (at line boundaries, ``seq`` kept without gaps)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ftkit.analysis.engine import analyze_paths
from ftkit.testing.synthetic import generate
from ftkit.testing.synthetic_spec import SyntheticSpec

SPEC = SyntheticSpec(
    cells=3, tp=1, engines=1, rollouts=2, steps_per_rollout=2, samples_per_rollout=8, tensors=3, faults=0
)


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _write(path: Path, events: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events))


def _errors(events: Path) -> set[str]:
    return {f.code for f in analyze_paths([events]).findings if f.severity.value == "error"}


@pytest.fixture()
def killed(tmp_path: Path) -> Path:
    """Three cells, cell 2 killed in step 1 after committing step 0; the driver declares the death
    right after its metric of step 0 (before the survivors report step 1), as a real driver does
    when the kill is seen at dispatch."""
    generate(tmp_path, SyntheticSpec(**{**SPEC.__dict__, "faults": 1}))
    events = tmp_path / "events"
    driver = events / "driver-i0.jsonl"
    evs = _events(driver)
    metric0 = next(e for e in evs if e["type"] == "metric" and e.get("step") == 0)
    for e in evs:
        declares = e["type"] in ("fault_injected", "cell_state") and e.get("new", "errored") == "errored"
        if declares and e.get("cell") == 2:
            e["time"] = metric0["time"] + 1e-6 * (1 + (e["type"] == "cell_state"))
    _write(driver, evs)
    assert _errors(events) == set()
    return events


@pytest.mark.parametrize("cut", ["step_outcome", "state_fingerprint", "witness_counts"])
def test_evidence_is_owed_up_to_the_declared_death(killed: Path, cut: str) -> None:
    """Item 1: cell 2's log cut just before its step-0 evidence (no seq gap; the stream ends
    without log_closed, which its declared death excuses) fails: step 0 was declared trained before
    the death, so cell 2 committed it and owed everything."""
    path = killed / "trainer-c2-r0-i0.jsonl"
    evs = _events(path)
    at = next(i for i, e in enumerate(evs) if e["type"] == cut and e["step"] == 0)
    _write(path, evs[:at])
    assert _errors(killed) & {"FT106", "FT112"}


def _digit(h: str) -> str:
    """``h`` with its first hex digit changed."""
    return ("1" if h[0] != "1" else "2") + h[1:]


def _tamper(path: Path, kind: str, edit: Any, which: int = 0) -> dict[str, Any]:
    evs = _events(path)
    ev = [e for e in evs if e["type"] == kind][which]
    edit(ev)
    _write(path, evs)
    return ev


def _findings(events: Path) -> list[Any]:
    return [f for f in analyze_paths([events]).findings if f.severity.value == "error"]


def test_a_total_of_the_only_live_cell_is_recomputed(tmp_path: Path) -> None:
    """Item 2: one live cell, nobody to compare with: the total is still a function of its parts."""
    generate(tmp_path, SyntheticSpec(**{**SPEC.__dict__, "cells": 1}))
    events = tmp_path / "events"
    assert _errors(events) == set()
    _tamper(events / "trainer-c0-r0-i0.jsonl", "state_fingerprint", lambda e: e.update(total=_digit(e["total"])))
    found = _findings(events)
    assert [f.code for f in found] == ["FT111"] and "per-tensor entries" in found[0].message


@pytest.mark.parametrize("part", ["params", "optimizer"])
def test_a_per_tensor_entry_changed_with_its_total_left_alone(tmp_path: Path, part: str) -> None:
    """Item 3: the line's parts contradict its total (FT111), and the two live cells now disagree
    on that tensor: FT101 names it."""
    generate(tmp_path, SyntheticSpec(**{**SPEC.__dict__, "cells": 2}))
    events = tmp_path / "events"
    ev = _tamper(
        events / "trainer-c1-r0-i0.jsonl",
        "state_fingerprint",
        lambda e: e[part].update({n: _digit(h) for n, h in list(e[part].items())[:1]}),
    )
    name = next(iter(ev[part]))
    found = _findings(events)
    assert {f.code for f in found} == {"FT111", "FT101"}
    ft101 = next(f for f in found if f.code == "FT101")
    assert ft101.evidence["cells"] == [1] and ft101.evidence["tensors"] == [
        ("optimizer/" if part == "optimizer" else "") + name
    ]


@pytest.mark.parametrize("kind", ["weights_sent", "engine_weights"])
def test_a_params_entry_of_the_weights_is_recomputed(tmp_path: Path, kind: str) -> None:
    """Item 3: a ``weights_sent`` / ``engine_weights`` entry changed, total left alone: FT111, and
    FT102 (what the engine holds differs from what was sent) names the tensor."""
    generate(tmp_path, SPEC)
    events = tmp_path / "events"
    path = events / ("driver-i0.jsonl" if kind == "weights_sent" else "engine-r0-i0.jsonl")
    ev = _tamper(path, kind, lambda e: e["params"].update({n: _digit(h) for n, h in list(e["params"].items())[:1]}))
    found = _findings(events)
    assert {f.code for f in found} == {"FT111", "FT102"}
    assert next(f for f in found if f.code == "FT102").evidence["tensors"] == [next(iter(ev["params"]))]


def _renumber(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A forger's fix-up: ``seq`` without gaps and a matching ``log_closed`` count."""
    for seq, e in enumerate(events):
        e["seq"] = seq
    events[-1]["lines"] = events[-1]["seq"]
    return events


def test_evidence_moved_into_another_cells_file_counts_for_nobody(tmp_path: Path) -> None:
    """Item 4: cell 1's step-1 evidence removed from its file and appended to cell 0's (with
    ``cell: 1`` and cell 0's source): the event is not its writer's (FT111), and cell 1 then has
    no evidence of step 1 (FT106 / FT112)."""
    generate(tmp_path, SyntheticSpec(**{**SPEC.__dict__, "cells": 2}))
    events = tmp_path / "events"
    own, other = events / "trainer-c0-r0-i0.jsonl", events / "trainer-c1-r0-i0.jsonl"
    moved_types = ("step_outcome", "state_fingerprint", "witness_counts")
    theirs = _events(other)
    moved = [e for e in theirs if e["type"] in moved_types and e["step"] == 1]
    _write(other, _renumber([e for e in theirs if e not in moved]))
    mine = _events(own)
    at = max(i for i, e in enumerate(mine) if e.get("step") == 1) + 1
    src = mine[0]["source"]
    _write(own, _renumber([*mine[:at], *({**e, "source": src} for e in moved), *mine[at:]]))
    found = _findings(events)
    assert any(f.code == "FT111" and "written by the process of cell 0" in f.message for f in found)
    assert {f.code for f in found} & {"FT106", "FT112"}


def test_engine_weights_written_by_another_engine(tmp_path: Path) -> None:
    """Item 4 for engines: an ``engine_weights`` of engine 1 in engine 0's log is not engine 1's."""
    generate(tmp_path, SyntheticSpec(**{**SPEC.__dict__, "engines": 2}))
    events = tmp_path / "events"
    path = events / "engine-r0-i0.jsonl"
    evs = _events(path)
    extra = {**next(e for e in evs if e["type"] == "engine_weights"), "engine": 1}
    _write(path, _renumber([evs[0], extra, *evs[1:]]))
    assert any(f.code == "FT111" and "written by engine 0" in f.message for f in _findings(events))
