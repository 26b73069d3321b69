"""Finding codes of ``ftkit compare-runs`` (documented in docs/compare-runs.md).

Errors make the command exit 1; warnings are reported and never change the exit code (a run
that is a prefix of the other is a warning unless ``--require-same-length`` makes it an
error); the info finding lists the configs' differences.
"""

from __future__ import annotations

from ftkit.findings import RuleTable, Severity

E, W, INFO = Severity.error, Severity.warning, Severity.info
CODES: dict[str, tuple[str, Severity, str]] = {
    "CR001": (
        "state-divergence",
        E,
        "the state fingerprint (parameters and optimizer state, per rank) of a step both runs committed differs; "
        "the first differing tensor is named",
    ),
    "CR002": (
        "metric-divergence",
        E,
        "a metric of a common step (or rollout) differs: any bit by default, outside --rtol/--atol when given",
    ),
    "CR003": (
        "witness-divergence",
        E,
        "a common step trained other samples (witness ids or counts differ)",
    ),
    "CR004": (
        "weights-divergence",
        E,
        "the weights sent to the engines for a version differ; the first differing tensor is named",
    ),
    "CR005": (
        "canary-divergence",
        E,
        "the canary log-probs of a weights version (engines' or trainers') differ beyond the tolerance",
    ),
    "CR006": (
        "length-mismatch",
        W,
        "one run committed steps the other did not (a prefix); an error with --require-same-length",
    ),
    "CR007": (
        "config-difference",
        INFO,
        "the runs' configs differ; the fields that determine the result (seed, lr, model, data, precision, "
        "layout) are listed first",
    ),
    "CR008": (
        "nothing-compared",
        E,
        "the runs have no committed step in common: nothing was compared (never a pass)",
    ),
}

#: The kind of evidence each divergence code covers, in the order a step's evidence is made:
#: the weights a rollout is sampled with and their canary scores, then per step the samples
#: trained, the metrics of the forward / backward pass, the state after the optimizer step.
KIND_CODES = {"weights": "CR004", "canary": "CR005", "witness": "CR003", "metric": "CR002", "state": "CR001"}
KIND_TEXT = {
    "weights": "the weights sent to the engines",
    "canary": "the canary log-probs",
    "witness": "the samples trained (witness ledger)",
    "metric": "the metrics",
    "state": "the state fingerprint",
}

TABLE = RuleTable(CODES)
finding = TABLE.finding
summaries = TABLE.summaries
