"""Finding codes of ``ftkit compare-dumps`` (documented in docs/dumps.md).

Errors make the command exit 1 (with the default ``--fail-on error``); warnings are reported
and exit 1 only with ``--fail-on warning``.
"""

from __future__ import annotations

from ftkit.findings import RuleTable, Severity

E, W = Severity.error, Severity.warning
CODES: dict[str, tuple[str, Severity, str]] = {
    "CD001": (
        "value-mismatch",
        E,
        "values differ: any bit under --exact, an element outside --rtol/--atol, or a failing --rules predicate",
    ),
    "CD002": ("shape-mismatch", E, "the two sides hold the tensor with different shapes"),
    "CD003": (
        "dtype-mismatch",
        E,
        "the two sides hold the tensor with different dtypes (metrics still computed when shapes agree)",
    ),
    "CD004": ("tensor-missing", E, "tensors present on one side only (grouped per micro-shard / file)"),
    "CD005": ("file-missing", E, "a safetensors file (rollouts/, final/, checkpoints/, ...) exists on one side only"),
    "CD006": ("rollout-missing", E, "a dumped rollout (prefix/phase/rollout) exists on one side only"),
    "CD007": (
        "replica-divergence",
        E,
        "copies of one tensor on one side (cells or TP ranks) are not bitwise identical",
    ),
    "CD008": (
        "shard-layout",
        E,
        "TP shards of a tensor are incomplete, disagree on their sharding, or are mixed with replicated copies",
    ),
    "CD009": ("no-rule", E, "no --rules entry matches the tensor (fail closed)"),
    "CD010": ("non-finite", W, "the tensor holds NaN or Inf values (the same on both sides)"),
    "CD011": ("orphan-data-file", W, "a safetensors file in a dump tree has no index (an interrupted write)"),
    "CD012": (
        "config-mismatch",
        E,
        "the two runs' run.json differ in what shapes the data (micro-shards, batch, model, seed, ...; listed first)",
    ),
    "CD013": (
        "rollout-superseded",
        W,
        "a rollout dumped on one side only that neither run's final config dumps (a run extended by --resume)",
    ),
    "CD014": (
        "config-unchecked",
        E,
        "a run directory has no run.json (or one without a config): the CD012 check could not be made",
    ),
}


TABLE = RuleTable(CODES)
finding = TABLE.finding
summaries = TABLE.summaries
