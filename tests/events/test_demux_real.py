"""Permutations and splits of a REAL ``ftkit train`` log, clean and with planted violations, give
the analysis of its per-process files (issue 13)."""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from logsplit import log_lines, signature, write_arrangement

from ftkit.analysis.engine import analyze_paths
from ftkit.events.merge import write_merged_log

pytestmark = pytest.mark.slow

Event = dict[str, Any]


def _first(kind: str, **match: Any) -> Callable[[Event, dict[str, int]], bool]:
    """Mutate only the first event of ``kind`` matching ``match``."""

    def pick(ev: Event, seen: dict[str, int]) -> bool:
        if ev["type"] != kind or any(ev.get(k) != v for k, v in match.items()):
            return False
        seen[kind] = seen.get(kind, 0) + 1
        return seen[kind] == 1

    return pick


def _divergence(ev: Event) -> None:
    """One tensor's fingerprint changed, and the total recomputed from the parts (the analyzer
    recomputes every total: a total alone changed is a log-integrity finding, not a divergence)."""
    from ftkit.tensors.fingerprint import state_total

    name = sorted(ev["params"])[0]
    ev["params"][name] = "0" * len(ev["params"][name])
    ev["total"] = state_total(ev["params"], ev["optimizer"])


def _duplicate_witness(ev: Event) -> None:
    ev["counts"] = [c + 1 if i == 0 else c for i, c in enumerate(ev["counts"])]


def _discard(ev: Event) -> None:
    ev["outcome"] = "discarded"


def _nan(ev: Event) -> None:
    ev["values"] = {k: math.nan for k in ev["values"]}


def _fail(ev: Event) -> None:
    ev["status"] = "failed"


def _stale_engine(ev: Event) -> None:
    """One held tensor's fingerprint changed, the total recomputed from the parts (as ``_divergence``)."""
    from ftkit.tensors.fingerprint import combine

    name = sorted(ev["params"])[0]
    ev["params"][name] = "f" * len(ev["params"][name])
    ev["total"] = combine(ev["params"])


# code -> (which event, how): each keeps the line's source and seq, so only the planted rule fires
PLANTS: dict[str, tuple[Callable[[Event, dict[str, int]], bool], Callable[[Event], None]]] = {
    "FT101": (_first("state_fingerprint", cell=1), _divergence),
    "FT102": (_first("engine_weights"), _stale_engine),
    "FT104": (lambda ev, seen: ev["type"] == "witness_counts" and ev["step"] == 0, _duplicate_witness),
    "FT106": (_first("step_outcome", cell=1), _discard),
    "FT109": (_first("metric"), _nan),
    "FT113": (_first("run_finished"), _fail),
}


def _planted(events: Path, code: str, out: Path) -> Path:
    pick, mutate = PLANTS[code]
    seen: dict[str, int] = {}
    out.mkdir(parents=True, exist_ok=True)
    for path in sorted(events.glob("*.jsonl")):
        lines = []
        for line in path.read_bytes().splitlines():
            ev = json.loads(line)
            if pick(ev, seen):
                mutate(ev)
                line = json.dumps(ev, separators=(",", ":")).encode()
            lines.append(line)
        (out / path.name).write_bytes(b"\n".join(lines) + b"\n")
    return out


@pytest.fixture(scope="module")
def variants(real_run: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str | None, tuple[Path, dict]]:
    out: dict[str | None, tuple[Path, dict]] = {None: (real_run, signature(analyze_paths([real_run])))}
    for code in PLANTS:
        d = _planted(real_run, code, tmp_path_factory.mktemp(code))
        out[code] = (d, signature(analyze_paths([d])))
    return out


def test_the_real_run_is_clean_and_each_plant_fires_its_rule(variants):
    assert variants[None][1]["verdict"] == "pass"
    for code in PLANTS:
        sig = variants[code][1]
        assert sig["verdict"] == "fail" and {f[0] for f in sig["findings"] if f[1] == "error"} == {code}, code


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    plant=st.sampled_from([None, *PLANTS]),
    seed=st.integers(0, 2**32),
    parts=st.integers(1, 4),
    gz=st.booleans(),
)
def test_real_log_any_permutation_and_split(variants, plant, seed, parts, gz):
    events, reference = variants[plant]
    with tempfile.TemporaryDirectory() as d:
        files = write_arrangement(log_lines(events), Path(d), seed, parts, gz)
        assert signature(analyze_paths(files)) == reference


def test_real_log_cat_and_merged(variants, tmp_path):
    for plant, (events, reference) in variants.items():
        cat = tmp_path / f"cat-{plant}.jsonl"
        cat.write_bytes(b"".join(p.read_bytes() for p in sorted(events.glob("*.jsonl"))))
        assert signature(analyze_paths([cat])) == reference, plant
        merged = write_merged_log(events, tmp_path / f"merged-{plant}.jsonl")
        result = analyze_paths([merged.path])
        assert result.stats["read_as"] == "sequential" and signature(result) == reference, plant
