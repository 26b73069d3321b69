"""The lines every rendering of ``ftkit compare-runs`` leads with: the cause (the configs'
result-determining differences) and the first divergence (or what was found equal)."""

from __future__ import annotations

from ftkit.runs.codes import KIND_TEXT
from ftkit.runs.compare import RunsResult


def cause_line(result: RunsResult) -> str | None:
    """``the runs differ in lr (0.005 vs 0.01)...``: the result-determining config differences."""
    rows = [r for r in result.config if r["kind"] == "result"]
    if not rows:
        return None
    text = ", ".join(f"{r['field']} ({r['a']!r} vs {r['b']!r})" for r in rows[:6])
    return f"the runs' configs differ in what determines the result: {text}" + (
        f" and {len(rows) - 6} more" if len(rows) > 6 else ""
    )


def first_line(result: RunsResult) -> str:
    """The divergence in one line (or what was found equal)."""
    s, first = result.steps, result.first_divergence
    if first is None:
        if not s["common"]:
            return "nothing compared: the runs have no committed step in common"
        return f"every one of the {s['common']} common step(s) is equal ({result.options.tolerance.describe()})"
    at = (
        f"step {first['step']} (rollout {first['rollout']})"
        if first["step"] is not None
        else f"rollout {first['rollout']}"
    )
    tensor = f", first tensor {first['tensor']}" if first["tensor"] else ""
    also = f" (also: {', '.join(first['also'])})" if first["also"] else ""
    return (
        f"first divergence at {at}: {KIND_TEXT[first['what']]}{tensor}{also}; "
        f"{first['differing_steps']} of the {first['common_steps_from']} common step(s) from there on differ"
    )
