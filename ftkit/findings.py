"""The findings model shared by every reporting command (analyze-events, compare-dumps, train,
verify-checkpoint). It sits below every producer of findings (``analysis/``, ``dumps/``,
``checkpoint/``) and every renderer (``report/``) and imports neither.

A *finding* is one violated expectation with a stable ``code`` (``FT101``), the ``rule`` name,
a ``severity``, a one-line ``message``, ``evidence`` (which cells, ranks, rollouts, steps,
tensors, files, lines) and ``fix``: the rule's "how to fix" line (empty when the producer has
none). ``Finding.where()`` is the location a reader should open (``file:line`` or a path).
A *rule summary* says how many things a rule checked and how many findings it produced, so a
report can show that a rule ran and found nothing (as opposed to not running at all).

``verdict`` maps findings to the command's outcome for a ``--fail-on`` threshold.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum
from typing import Any

from pydantic import BaseModel, Field


class Severity(str, Enum):
    error = "error"
    warning = "warning"
    info = "info"

    @property
    def rank(self) -> int:
        """Higher is more severe; used for sorting and for ``--fail-on``."""
        return {"error": 2, "warning": 1, "info": 0}[self.value]


class FailOn(str, Enum):
    """The lowest severity that makes a reporting command exit 1."""

    error = "error"
    warning = "warning"
    never = "never"

    def fails(self, severity: Severity) -> bool:
        """Whether a finding of ``severity`` makes the command fail under this threshold."""
        if self is FailOn.never:
            return False
        return severity.rank >= Severity(self.value).rank


class Finding(BaseModel):
    code: str
    rule: str
    severity: Severity
    message: str
    evidence: dict[str, Any] = Field(default_factory=dict)
    fix: str = Field(default="", description="the rule's one-line 'how to fix' (every renderer shows it)")

    def where(self) -> str | None:
        """``file:line`` (or ``file``, or the evidence's ``path``) when the evidence locates it."""
        ev = self.evidence
        if ev.get("file"):
            line = ev.get("line")
            return f"{ev['file']}:{line}" if line is not None else str(ev["file"])
        if ev.get("path"):
            return str(ev["path"])
        return None


class RuleSummary(BaseModel):
    code: str
    rule: str
    severity: Severity
    description: str = ""
    fix: str = Field(default="", description="the rule's one-line 'how to fix' (every renderer shows it)")
    checked: int = 0
    findings: int = 0


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Most severe first, then by code; stable within a code (keeps log order)."""
    return sorted(findings, key=lambda f: (-f.severity.rank, f.code))


def verdict(findings: Iterable[Finding], fail_on: FailOn) -> str:
    """``"fail"`` if any finding is at or above ``fail_on``, ``"pass"`` otherwise."""
    return "fail" if any(fail_on.fails(f.severity) for f in findings) else "pass"
