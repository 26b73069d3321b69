"""Finding codes of ``ftkit compare-dumps`` (documented in docs/dumps.md).

Errors make the command exit 1 (with the default ``--fail-on error``); warnings are reported
and exit 1 only with ``--fail-on warning``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ftkit.findings import Finding, RuleSummary, Severity

E, W = Severity.error, Severity.warning
CODES: dict[str, tuple[str, Severity, str]] = {
    "CD001": (
        "value-mismatch",
        E,
        "values differ: any bit under --exact, an element outside --rtol/--atol, or a failing --rules predicate",
    ),
    "CD002": ("shape-mismatch", E, "the two sides hold the tensor with different shapes"),
    "CD003": ("dtype-mismatch", E, "the two sides hold the tensor with different dtypes"),
    "CD004": ("tensor-missing", E, "tensors present on one side only (grouped per micro-shard / file)"),
    "CD005": ("file-missing", E, "a safetensors file (rollouts/, final/, checkpoints/, ...) exists on one side only"),
    "CD006": ("rollout-missing", E, "a dumped rollout (prefix/phase/rollout) exists on one side only"),
    "CD007": (
        "replica-divergence",
        E,
        "copies of one tensor on one side (cells or TP ranks) are not bitwise identical",
    ),
    "CD008": ("shard-layout", E, "TP shards of a tensor are incomplete or disagree on their sharding"),
    "CD009": ("no-rule", E, "no --rules entry matches the tensor (fail closed)"),
    "CD010": ("non-finite", W, "the tensor holds NaN or Inf values (the same on both sides)"),
    "CD011": ("orphan-data-file", W, "a safetensors file in a dump tree has no index (an interrupted write)"),
    "CD012": (
        "config-mismatch",
        E,
        "the two runs' run.json differ in what shapes the data (micro-shards, batch, model, seed, ...)",
    ),
}


def finding(code: str, message: str, **evidence: Any) -> Finding:
    rule, severity, _ = CODES[code]
    return Finding(
        code=code,
        rule=rule,
        severity=severity,
        message=message,
        evidence={k: v for k, v in evidence.items() if v is not None},
    )


def summaries(checked: dict[str, int], findings: Iterable[Finding]) -> list[RuleSummary]:
    """One summary per code: how many things it checked and how many findings it produced."""
    counts: dict[str, int] = {}
    for f in findings:
        counts[f.code] = counts.get(f.code, 0) + 1
    return [
        RuleSummary(
            code=code,
            rule=rule,
            severity=sev,
            description=desc,
            checked=checked.get(code, 0),
            findings=counts.get(code, 0),
        )
        for code, (rule, sev, desc) in CODES.items()
    ]
