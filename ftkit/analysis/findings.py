"""The findings model shared by every reporting command.

A *finding* is one violated expectation with a stable ``code`` (``FT101``), the ``rule`` name,
a ``severity``, ``evidence`` (which cells, ranks, rollouts, steps, tensors, files, lines) and the
rule's ``fix`` line (what to do about it).
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


class RuleSummary(BaseModel):
    code: str
    rule: str
    severity: Severity
    description: str = ""
    checked: int = 0
    findings: int = 0


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Most severe first, then by code; stable within a code (keeps log order)."""
    return sorted(findings, key=lambda f: (-f.severity.rank, f.code))


def verdict(findings: Iterable[Finding], fail_on: FailOn) -> str:
    """``"fail"`` if any finding is at or above ``fail_on``, ``"pass"`` otherwise."""
    return "fail" if any(fail_on.fails(f.severity) for f in findings) else "pass"
