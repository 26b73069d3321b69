"""The ``Report`` of ``ftkit compare-dumps``: the JSON document, the verdict line, the step
summary, the JUnit cases (and, through ``report``, the human and HTML renderings).

JSON (``schema_version`` added by ``Output.json``)::

    {"command": "compare-dumps", "a": ..., "b": ..., "kind": "run", "mode": "exact (bitwise)",
     "verdict": "pass"|"fail", "stats": {...}, "first_divergence": <pair>|null,
     "worst": [<pair>...], "findings": [...], "rules": [...], "tensors": [<pair>...]}

A ``<pair>`` is ``PairResult.to_dict()``: id, group, name, kind, status, message, dtypes,
shapes, origins, rule and metrics. JUnit: one test case per compared tensor (classname
``ftkit.compare-dumps.<group>``), failing with its findings; missing rollouts and files
and orphan files get one case each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ftkit.dumps.compare import CompareResult
from ftkit.findings import Finding
from ftkit.report.compare_rank import CAUSES, metrics, ordered_findings, worst
from ftkit.report.emit import Report
from ftkit.report.escaping import md_text
from ftkit.report.github import markdown_table
from ftkit.report.junit import Case, Failure, finding_failure

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    from rich.console import Console

SUITE = "ftkit.compare-dumps"


def json_document(result: CompareResult, verdict: str, top: int) -> dict[str, Any]:
    first = result.first_divergence
    return {
        "command": "compare-dumps",
        "a": str(result.a),
        "b": str(result.b),
        "kind": result.kind,
        "mode": result.options.describe(),
        "verdict": verdict,
        "stats": result.stats,
        "config_diff": {k: {"a": va, "b": vb} for k, (va, vb) in result.config_diff.items()},
        "first_divergence": first.to_dict() if first else None,
        "worst": [p.to_dict() for p in worst(result, top)],
        "findings": [f.model_dump(mode="json") for f in ordered_findings(result)],
        "rules": [r.model_dump(mode="json") for r in result.rules],
        "tensors": [p.to_dict() for p in result.pairs],
    }


def summary_line(result: CompareResult, verdict: str) -> str:
    """``pass: N tensors, E equal, C within tolerance, D differ; first divergence ID``, led by
    ``the runs' configs differ (seed, ...; CD012)`` when they do: the cause before the counts."""
    s = result.stats
    first = result.first_divergence
    cause = f"the runs' configs differ ({', '.join(result.config_diff)}; CD012); " if result.config_diff else ""
    return (
        f"{verdict}: {cause}{s['tensors']} tensors, {s['equal']} equal, {s['close']} within tolerance, "
        f"{s['differ']} differ" + (f"; first divergence {first.id}" if first else "")
    )


def report(result: CompareResult, verdict: str, top: int) -> Report:
    """The ``Report`` of ``ftkit compare-dumps`` for ``emit``. The human and HTML renderers
    (Rich tables, the heatmap) are imported only when their format is asked for."""

    def human(console: Console) -> None:
        from ftkit.report.compare_human import render_human

        render_human(console, result, verdict, top)

    def html(base: Path | None) -> str:
        from ftkit.report.html import render_html

        return render_html(result, verdict, base, max(top, 50))

    return Report(
        command="compare-dumps",
        verdict=verdict,
        findings=ordered_findings(result),
        rules=result.rules,
        summary=summary_line(result, verdict),
        document=lambda: json_document(result, verdict, top),
        human=human,
        step_summary=lambda: step_summary(result, verdict, top),
        junit_cases=lambda: junit_cases(result),
        html=html,
    )


def step_summary(result: CompareResult, verdict: str, top: int) -> str:
    """Markdown for ``$GITHUB_STEP_SUMMARY``: counts, first divergence, the worst tensors."""
    s = result.stats
    rows = [(k, v) for k, v in s.items()]
    md = [
        f"### ftkit compare-dumps: {verdict}",
        "",
        md_text(f"{result.a} vs {result.b} ({result.options.describe()})"),
        "",
    ]
    if result.config_diff:  # the cause first
        md += [
            "**The runs' configs differ (CD012); the tensor findings follow from it:**",
            "",
            markdown_table(
                ["field", "A", "B"], [(k, repr(va), repr(vb)) for k, (va, vb) in result.config_diff.items()]
            ),
            "",
        ]
    md += [markdown_table(["", "count"], rows)]
    first = result.first_divergence
    if first:
        md += ["", f"**First divergence:** {md_text(first.id)}: {md_text(first.message)}"]
    bad = worst(result, top)
    if bad:
        md += [
            "",
            markdown_table(
                ["tensor", "status", "max_abs", "max_rel", "dissimilarity"],
                [
                    (
                        p.id,
                        p.status,
                        f"{metrics(p).max_abs:.3g}",
                        f"{metrics(p).max_rel:.3g}",
                        f"{metrics(p).dissimilarity:.3g}",
                    )
                    for p in bad
                ],
            ),
        ]
    return "\n".join(md)


def junit_cases(result: CompareResult) -> list[Case]:
    """One case per loose finding and per compared tensor (failing with its error findings), in
    ``ordered_findings``' order: config differences, then the first divergence, then the rest."""
    by_tensor: dict[str, list[Finding]] = {}
    loose: list[Finding] = []
    for f in result.findings:
        key = f.evidence.get("tensor")
        if key is not None:
            by_tensor.setdefault(key, []).append(f)
        elif f.code != "CD004":  # missing tensors fail their own cases below
            loose.append(f)
    tensors = []
    for p in result.pairs:
        failures = [finding_failure(f) for f in by_tensor.get(p.id, []) if f.severity.value == "error"]
        if p.status in ("missing_in_a", "missing_in_b"):
            failures.append(Failure(f"CD004 tensor-missing: {p.id} {p.message}"))
        tensors.append(Case(f"{SUITE}.{p.group}", p.id, failures, seconds=p.seconds))
    first = result.first_divergence.id if result.first_divergence is not None else None
    tensors.sort(key=lambda c: c.name != first)  # stable: capture order after the first divergence
    causes: list[Case] = []
    after: list[Case] = []
    for f in loose:
        what = f.evidence.get("rollout") or f.evidence.get("path") or f.code
        failures = [finding_failure(f)] if f.severity.value == "error" else []
        (causes if f.code in CAUSES else after).append(Case(f"{SUITE}.{f.rule}", str(what), failures))
    return causes + tensors + after
