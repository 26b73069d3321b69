"""Finding codes of ``ftkit verify-checkpoint`` (FT2xx, documented in docs/checkpoints.md).

Errors make the command exit 1; warnings are reported and exit 1 only with ``--fail-on
warning``. ``Collector`` gathers findings, how many things each code checked and the seconds
each code's checks took.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from time import perf_counter
from typing import Any

from ftkit.findings import Finding, RuleSummary, RuleTable, Severity, sort_findings

E, W = Severity.error, Severity.warning
CODES: dict[str, tuple[str, Severity, str]] = {
    "FT201": ("manifest-missing", E, "a checkpoint directory has no MANIFEST.json (it was never committed)"),
    "FT202": (
        "manifest-malformed",
        E,
        "MANIFEST.json is not a regular file (a symlink, FIFO, device), not JSON or not a protocol-1 manifest, "
        "or disagrees with itself or meta.json "
        "(step, state fingerprint, rank totals, meta.json listed)",
    ),
    "FT203": ("size-mismatch", E, "a file's size differs from the manifest"),
    "FT204": ("hash-mismatch", E, "a file's sha256 differs from the manifest"),
    "FT205": ("file-unlisted", E, "a file, directory or link in the checkpoint is not listed in the manifest"),
    "FT206": ("file-missing", E, "a file listed in the manifest is absent"),
    "FT207": (
        "safetensors-malformed",
        E,
        "a safetensors file is structurally broken (header length or JSON, dtypes, shapes, "
        "offsets that overlap or leave gaps, truncation, trailing bytes)",
    ),
    "FT208": ("tensor-mismatch", E, "a tensor's name, dtype, shape or fingerprint differs from the manifest"),
    "FT209": ("pickle-file", E, "a pickle file (or a torch.save zip archive) anywhere in the checkpoint tree"),
    "FT210": (
        "non-finite",
        E,
        "NaN or Inf in a floating tensor (optimizer state included), or a manifest whose scan is not clean",
    ),
    "FT211": (
        "retention-disagrees",
        E,
        "retention.json is missing, not a regular file or malformed, lists a checkpoint that is absent or differs, "
        "misses a published one, or does not follow its own policy; with the event log: its records are not what "
        "the last publication kept, or its policy is not the run's; or a run's checkpoints/ is a symlink",
    ),
    "FT212": ("latest-disagrees", E, "`latest` is missing, not a symlink, or not the newest recorded checkpoint"),
    "FT213": (
        "journal-mid-transition",
        E,
        "journal.json is pending (a transaction not rolled forward), not a regular file or malformed; with the "
        "event log: missing though the log published checkpoints, or its last transaction older than the log's",
    ),
    "FT214": (
        "fingerprint-vs-events",
        E,
        "the checkpoint's state fingerprint differs from the committed state_fingerprint the event log "
        "holds for its step, or the log holds none, or a logged total is not its own per-tensor entries', or "
        "those entries are not the manifest's (TP=1/PP=1), or the log never published the checkpoint, or its "
        "checkpoint_published manifest_sha256 / bytes are not the manifest's (--events)",
    ),
    "FT215": (
        "tainted-interval",
        E,
        "the checkpoint was published from a guard interval that saw non-finite values "
        "(its manifest, or grad_nonfinite / non-finite metrics in the log with --events)",
    ),
    "FT216": ("cleanup-pending", W, "a checkpoint retention dropped is still there (its deletion failed; journal)"),
    "FT217": ("stale-temp", W, "staging or deletion leftovers of a dead writer (reconcile / --resume removes them)"),
    "FT218": (
        "shard-set-broken",
        E,
        "the files of a payload group are not one plain file or the complete shard set 1..n of one n "
        "(a shard missing, extra or duplicated, a plain file next to shards), a tensor is in two files "
        "of a group, or a group's files disagree on their fingerprint prefix, or a training state checkpoint "
        "lacks one of its groups (model, optimizer, extra)",
    ),
}


TABLE = RuleTable(CODES)


class Collector:
    """Findings plus a per-code count of what was checked and the seconds it took (``timed``)."""

    def __init__(self) -> None:
        self.findings: list[Finding] = []
        self.checked: dict[str, int] = {}
        self.seconds: dict[str, float] = {}  # by code: its share of the timed passes that checked it

    def check(self, code: str, n: int = 1) -> None:
        self.checked[code] = self.checked.get(code, 0) + n

    @contextmanager
    def timed(self) -> Iterator[None]:
        """Time one pass of the verifier (loading a checkpoint, checking its files, the bookkeeping,
        the event log): its wall seconds are shared equally by the codes it checked (``check``
        called in the block), so a pass that serves several codes at once (one hash of a file is
        FT203, FT204, FT207, FT208 and FT210) is not counted several times. A pass that checked
        nothing is left to the command's total. Passes must not nest."""
        before = dict(self.checked)
        t0 = perf_counter()
        try:
            yield
        finally:
            spent = perf_counter() - t0
            codes = [c for c, n in self.checked.items() if n != before.get(c, 0)]
            for code in codes:
                self.seconds[code] = self.seconds.get(code, 0.0) + spent / len(codes)

    def add(self, code: str, message: str, **evidence: Any) -> None:
        self.findings.append(TABLE.finding(code, message, **evidence))

    def summaries(self) -> list[RuleSummary]:
        return TABLE.summaries(self.checked, self.findings)

    def sorted(self) -> list[Finding]:
        return sort_findings(self.findings)


def rules_markdown() -> str:
    """The rules table of docs/checkpoints.md."""
    return TABLE.markdown()
