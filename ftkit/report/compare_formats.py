"""Machine formats of ``ftkit compare-dumps``: the JSON document, GitHub output, JUnit cases.

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

from typing import Any

from ftkit.analysis.findings import Finding, sort_findings
from ftkit.dumps.compare import CompareResult, PairResult
from ftkit.dumps.metrics import Metrics
from ftkit.report.github import annotation_lines, markdown_table

SUITE = "ftkit.compare-dumps"


def worst(result: CompareResult, n: int) -> list[PairResult]:
    """The ``n`` most different compared tensors: failing first, then by dissimilarity, max_rel.
    Each has metrics (read them with ``compared``)."""
    ranked = [p for p in result.pairs if p.metrics is not None and not p.metrics.bitwise_equal]
    ranked.sort(key=lambda p: (not p.failed, -compared(p).dissimilarity, -compared(p).max_rel, -compared(p).max_abs))
    return ranked[:n]


def compared(p: PairResult) -> Metrics:
    """The metrics of a pair that was compared (one ``worst`` returned)."""
    assert p.metrics is not None, f"{p.id} was not compared"
    return p.metrics


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
        "first_divergence": first.to_dict() if first else None,
        "worst": [p.to_dict() for p in worst(result, top)],
        "findings": [f.model_dump(mode="json") for f in sort_findings(result.findings)],
        "rules": [r.model_dump(mode="json") for r in result.rules],
        "tensors": [p.to_dict() for p in result.pairs],
    }


def github_text(result: CompareResult, verdict: str) -> str:
    """Workflow annotations, one per finding, then a one-line summary as a notice."""
    s = result.stats
    first = result.first_divergence
    summary = (
        f"::notice title=ftkit compare-dumps::{verdict}: {s['tensors']} tensors, {s['equal']} equal, "
        f"{s['close']} within tolerance, {s['differ']} differ" + (f"; first divergence {first.id}" if first else "")
    )
    body = annotation_lines(sort_findings(result.findings))
    return f"{body}\n{summary}" if body else summary


def step_summary(result: CompareResult, verdict: str, top: int) -> str:
    s = result.stats
    rows = [(k, v) for k, v in s.items()]
    md = [
        f"### ftkit compare-dumps: {verdict}",
        "",
        f"`{result.a}` vs `{result.b}` ({result.options.describe()})",
        "",
        markdown_table(["", "count"], rows),
    ]
    first = result.first_divergence
    if first:
        md += ["", f"**First divergence:** `{first.id}`: {first.message}"]
    bad = worst(result, top)
    if bad:
        md += [
            "",
            markdown_table(
                ["tensor", "status", "max_abs", "max_rel", "dissimilarity"],
                [
                    (
                        f"`{p.id}`",
                        p.status,
                        f"{compared(p).max_abs:.3g}",
                        f"{compared(p).max_rel:.3g}",
                        f"{compared(p).dissimilarity:.3g}",
                    )
                    for p in bad
                ],
            ),
        ]
    return "\n".join(md)


def junit_cases(result: CompareResult) -> list[tuple[str, str, list[tuple[str, str]]]]:
    by_tensor: dict[str, list[Finding]] = {}
    loose: list[Finding] = []
    for f in result.findings:
        key = f.evidence.get("tensor")
        if key is not None:
            by_tensor.setdefault(key, []).append(f)
        elif f.code != "CD004":  # missing tensors fail their own cases below
            loose.append(f)
    cases = []
    for p in result.pairs:
        failures = [
            (f"{f.code} {f.rule}: {f.message}", _text(f))
            for f in by_tensor.get(p.id, [])
            if f.severity.value == "error"
        ]
        if p.status in ("missing_in_a", "missing_in_b"):
            failures.append((f"CD004 tensor-missing: {p.id} {p.message}", ""))
        cases.append((f"{SUITE}.{p.group}", p.id, failures))
    for f in loose:
        what = f.evidence.get("rollout") or f.evidence.get("path") or f.code
        cases.append(
            (
                f"{SUITE}.{f.rule}",
                str(what),
                [(f"{f.code} {f.rule}: {f.message}", _text(f))] if f.severity.value == "error" else [],
            )
        )
    return cases


def _text(f: Finding) -> str:
    return "\n".join(f"{k}: {v}" for k, v in f.evidence.items())
