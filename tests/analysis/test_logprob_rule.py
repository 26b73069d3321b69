"""FT114: engine-vs-trainer log-probs, on synthetic GRPO logs edited as a broken run would be."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ftkit.analysis.engine import analyze_paths
from ftkit.testing.synthetic import generate
from ftkit.testing.synthetic_spec import SyntheticSpec

Edit = Callable[[dict[str, Any]], None]


def _edit(events: Path, match: Callable[[dict[str, Any]], bool], edit: Edit) -> int:
    """Apply ``edit`` to every event of ``events/*.jsonl`` that ``match``es; how many were edited."""
    n = 0
    for f in sorted(events.glob("*.jsonl")):
        lines = f.read_text().splitlines()
        out = []
        for line in lines:
            ev = json.loads(line)
            if match(ev):
                edit(ev)
                n += 1
                line = json.dumps(ev)
            out.append(line)
        f.write_text("\n".join(out) + "\n")
    return n


def _run(tmp_path: Path, **spec: Any) -> Path:
    generate(tmp_path, SyntheticSpec(**{"loss": "grpo", "faults": 0, **spec}))
    return tmp_path / "events"


def _ft114(events: Path) -> tuple[list[Any], Any, set[str]]:
    result = analyze_paths([events])
    summary = {r.code: r for r in result.rules}["FT114"]
    return [f for f in result.findings if f.code == "FT114"], summary, {f.code for f in result.findings}


def _first_check(ev: dict[str, Any]) -> bool:
    return ev["type"] == "logprob_check" and ev["step"] == 0 and ev["cell"] == 0


def _mismatch(max_abs: float) -> Edit:
    def edit(ev: dict[str, Any]) -> None:
        ev["total"].update(differing=1, max_abs=max_abs, mean_abs=max_abs / ev["total"]["tokens"])
        ev["samples"][0].update(differing=1, max_abs=max_abs, mean_abs=max_abs / 4)
        ev["positions"][1].update(differing=1, max_abs=max_abs)

    return edit


def test_a_clean_grpo_log_is_checked_and_passes(tmp_path):
    found, summary, codes = _ft114(_run(tmp_path))
    assert not found and not codes and summary.checked > 0


def test_a_reinforce_log_is_checked_by_its_canaries_and_another_producers_log_not_at_all(tmp_path):
    found, summary, _ = _ft114(_run(tmp_path / "reinforce", loss="reinforce"))
    assert not found and summary.checked > 0
    generate(tmp_path / "pp2", SyntheticSpec(faults=0, pp=2))  # no canaries at pp=2, no GRPO
    found, summary, _ = _ft114(tmp_path / "pp2" / "events")
    assert not found and summary.checked == 0  # reported as not run, never as passed


def test_one_differing_bit_at_tp1_is_an_error_with_position_and_cause(tmp_path):
    events = _run(tmp_path, tp=1)
    assert _edit(events, _first_check, _mismatch(6e-8)) == 1
    found, _, codes = _ft114(events)
    assert codes == {"FT114"} and len(found) == 1
    f = found[0]
    assert f.severity.value == "error" and "response positions [1]" in f.message
    assert "arithmetic" in f.message and f.evidence["rollout"] == 0 and f.evidence["step"] == 0


def test_at_tp2_only_a_difference_over_the_tolerance_is_reported_as_a_warning(tmp_path):
    events = _run(tmp_path / "small", tp=2)
    _edit(events, _first_check, _mismatch(5e-7))  # rounding of the row-parallel sums
    assert _ft114(events)[0] == []
    events = _run(tmp_path / "large", tp=2)
    _edit(events, _first_check, _mismatch(0.3))
    found = _ft114(events)[0]
    assert len(found) == 1 and found[0].severity.value == "warning"


def test_stale_engine_weights_are_named_as_the_cause(tmp_path):
    events = _run(tmp_path, engines=2)
    old: dict[str, Any] = {}
    _edit(events, lambda ev: ev["type"] == "weights_sent" and ev["version"] == 0, old.update)

    def stale(ev: dict[str, Any]) -> None:
        ev["total"], ev["params"] = old["total"], old["params"]

    assert _edit(events, lambda ev: ev["type"] == "engine_weights" and ev["version"] == 1 and ev["engine"] == 1, stale)
    steps = SyntheticSpec().steps_per_rollout
    _edit(events, lambda ev: ev["type"] == "logprob_check" and ev["step"] == steps and ev["cell"] == 0, _mismatch(0.7))
    found, _, codes = _ft114(events)
    assert codes == {"FT102", "FT114"}
    assert len(found) == 1 and "stale weights: engine(s) [1] still hold version 0" in found[0].message


def test_samples_never_compared_fail_closed(tmp_path):
    events = _run(tmp_path)

    def drop_one(ev: dict[str, Any]) -> None:
        ev["witness_ids"], ev["samples"] = ev["witness_ids"][1:], ev["samples"][1:]

    assert _edit(events, _first_check, drop_one) == 1
    found, _, codes = _ft114(events)
    assert codes == {"FT114"} and len(found) == 1 and "never compared" in found[0].message


def test_an_engine_canary_off_by_one_bit_is_an_error_and_a_missing_one_fails_closed(tmp_path):
    events = _run(tmp_path / "off", loss="reinforce")

    def nudge(ev: dict[str, Any]) -> None:
        ev["logprobs"][3] = math.nextafter(ev["logprobs"][3], 0.0)

    engine1 = lambda ev: ev["type"] == "canary_logprobs" and ev.get("engine") == 1 and ev["version"] == 1  # noqa: E731
    assert _edit(events, engine1, nudge)
    found, _, codes = _ft114(events)
    assert codes == {"FT114"} and len(found) == 1
    assert found[0].message.startswith("canary log-probs of version 1: engine 1 differs")
    assert "on 1 of 8 tokens" in found[0].message

    events = _run(tmp_path / "missing", loss="reinforce")

    def rename(ev: dict[str, Any]) -> None:  # the trainers' canaries of version 2 become another's
        ev["version"] = 99

    trainer2 = lambda ev: ev["type"] == "canary_logprobs" and ev.get("cell") is not None and ev["version"] == 2  # noqa: E731
    assert _edit(events, trainer2, rename)
    found, _, codes = _ft114(events)
    assert codes == {"FT114"} and any("without a trainer's canary scores" in f.message for f in found)


def test_another_producers_log_with_a_loss_in_its_config_owes_no_canaries(tmp_path):
    from ftkit.evidence import EvidenceProfile, EvidenceRun

    profile = EvidenceProfile(fingerprint_every=None, witness=False, metric_every=None, weights=True)
    run = EvidenceRun(tmp_path, profile, config={"loss": "grpo"}, engines=1)
    for step in range(4):
        run.step_outcome(step)
    run.close()
    found, summary, _ = _ft114(tmp_path / "events")
    assert not found and summary.checked == 0
