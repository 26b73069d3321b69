"""Every rule stays silent on clean runs and fires on a run with exactly its violation.

The property test draws random run layouts (cells, tp, pp, engines, rollouts, faults with
reconfigure and heal, seeds) from the synthetic generator, which is clean by construction,
and injects one violation of one rule.
"""

from __future__ import annotations

import tempfile

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ftkit.analysis.engine import analyze_paths
from ftkit.analysis.registry import all_rules
from ftkit.findings import FailOn
from ftkit.testing.synthetic import generate
from ftkit.testing.synthetic_spec import VIOLATIONS, SyntheticSpec

NEEDS = {"FT101": {"cells": 2}, "FT106": {"cells": 2}, "FT107": {"cells": 2}, "FT102": {"engines": 1}}

specs = st.builds(
    SyntheticSpec,
    cells=st.integers(1, 5),
    tp=st.integers(1, 2),
    pp=st.integers(1, 2),
    engines=st.integers(0, 3),
    rollouts=st.integers(1, 3),
    steps_per_rollout=st.sampled_from([2, 3, 4]),
    samples_per_rollout=st.just(12),
    micro_shards=st.integers(1, 8),
    tensors=st.integers(4, 30),
    faults=st.integers(0, 2),
    heal_after=st.integers(0, 2),
    checkpoint_every=st.integers(1, 5),
    seed=st.integers(0, 10_000),
    loss=st.sampled_from(["reinforce", "grpo"]),
)


def _codes(spec: SyntheticSpec) -> set[str]:
    with tempfile.TemporaryDirectory() as d:
        generate(d, spec)
        result = analyze_paths([d])
    return {f.code for f in result.findings}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs)
def test_clean_runs_have_no_findings(spec):
    assert _codes(spec) == set()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs, st.sampled_from(VIOLATIONS))
def test_one_violation_fires_exactly_its_rule(spec, code):
    for field, minimum in NEEDS.get(code, {}).items():
        setattr(spec, field, max(getattr(spec, field), minimum))
    if code == "FT107":  # a fault, and room to heal before the run ends
        spec.rollouts = max(spec.rollouts, -(-(4 + spec.heal_after) // spec.steps_per_rollout))
    spec.violation = code
    try:
        codes = _codes(spec)
    except ValueError as exc:  # the generator says the layout cannot hold this violation
        assume("cannot inject" not in str(exc))
        raise
    assert codes == {code}


@pytest.mark.parametrize("code", VIOLATIONS)
def test_each_rule_fires_on_the_default_layout(tmp_path, code):
    generate(tmp_path, SyntheticSpec(violation=code))
    result = analyze_paths([tmp_path / "events"])
    found = [f for f in result.findings if f.code == code]
    assert found and {f.code for f in result.findings} == {code}
    summary = {r.code: r for r in result.rules}[code]
    assert summary.findings == len(found) and summary.checked > 0
    assert result.verdict(FailOn.warning) == "fail"


def test_registry_has_the_rules_with_metadata():
    rules = all_rules()
    assert list(rules) == [f"FT1{i:02d}" for i in range(1, 17)]
    for cls in rules.values():
        assert cls.name and cls.description and cls.fix and cls.severity.value in ("error", "warning")
