"""The findings model shared by every reporting command (analyze-events, compare-dumps, train,
verify-checkpoint). It sits below every producer of findings (``analysis/``, ``dumps/``,
``checkpoint/``) and every renderer (``report/``) and imports neither.

A *finding* is one violated expectation with a stable ``code`` (``FT101``), the ``rule`` name,
a ``severity``, a one-line ``message``, ``evidence`` (which cells, ranks, rollouts, steps,
tensors, files, lines) and ``fix``: the rule's "how to fix" line (empty when the producer has
none). ``Finding.where()`` is the location a reader should open (``file:line`` or a path).
A *rule summary* says how many things a rule checked and how many findings it produced, so a
report can show that a rule ran and found nothing (as opposed to not running at all: a rule
that checked nothing is ``not run`` in every format, never passed), and ``not_covered`` when
the input lacks the evidence the rule needs by the producer's own profile.

``verdict`` maps findings to the command's outcome for a ``--fail-on`` threshold.
``RuleTable`` is a command's table of codes (``compare-dumps``' CDxxx, ``verify-checkpoint``'s
FT2xx): it makes their findings, their rule summaries and the docs' rules table.

Both are plain dataclasses (no pydantic: every forensic command imports this module, and its
start-up matters). ``model_dump(mode="json")`` gives the JSON form the reports embed, the
same as the pydantic models it replaced: enums as values, paths as strings, tuples and sets as
lists, non-finite floats as ``null``; ``severity`` given as a string is converted to ``Severity``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any


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


def _json_value(v: Any) -> Any:
    """``v`` in the JSON form pydantic's ``model_dump(mode="json")`` gives for an ``Any`` field."""
    if v is None or isinstance(v, (str, bool, int)) and not isinstance(v, Enum):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, Enum):
        return _json_value(v.value)
    if isinstance(v, dict):
        return {str(k): _json_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_json_value(x) for x in v]
    if isinstance(v, os.PathLike):
        return os.fspath(v)
    if hasattr(v, "model_dump"):
        return v.model_dump(mode="json")
    raise TypeError(f"not JSON serialisable: {type(v).__name__}")


class _Model:
    """``model_dump`` for the dataclasses below (the pydantic method name their callers use)."""

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        """The fields as a dict; ``mode="json"``: JSON-ready (see the module docstring)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]
        return _json_value(out) if mode == "json" else out


@dataclass
class Finding(_Model):
    code: str
    rule: str
    severity: Severity
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    fix: str = ""  # the rule's one-line 'how to fix' (every renderer shows it)

    def __post_init__(self) -> None:
        self.severity = Severity(self.severity)

    def where(self) -> str | None:
        """``file:line`` (or ``file``, or the evidence's ``path``) when the evidence locates it."""
        ev = self.evidence
        if ev.get("file"):
            line = ev.get("line")
            return f"{ev['file']}:{line}" if line is not None else str(ev["file"])
        if ev.get("path"):
            return str(ev["path"])
        return None


@dataclass
class RuleSummary(_Model):
    code: str
    rule: str
    severity: Severity
    description: str = ""
    fix: str = ""  # the rule's one-line 'how to fix' (every renderer shows it)
    checked: int = 0
    findings: int = 0
    # why the rule could not judge this input (the producer did not promise its evidence:
    # ftkit.analysis.profile); every renderer shows it in place of a pass. None: covered.
    not_covered: str | None = None

    def __post_init__(self) -> None:
        self.severity = Severity(self.severity)

    @property
    def status(self) -> str:
        """``failed`` (it made findings), ``not covered`` (the producer did not promise the
        evidence it needs: ``not_covered`` says why), ``passed`` (it checked something and found
        nothing) or ``not run`` (it checked nothing: no evidence either way); ``not covered`` and
        ``not run`` are never shown as passed (JUnit's ``skipped``)."""
        if self.findings:
            return "failed"
        if self.not_covered is not None:
            return "not covered"
        return "passed" if self.checked else "not run"

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        """The fields plus ``status``."""
        return {**super().model_dump(mode), "status": self.status}


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Most severe first, then by code; stable within a code (keeps log order)."""
    return sorted(findings, key=lambda f: (-f.severity.rank, f.code))


def verdict(findings: Iterable[Finding], fail_on: FailOn) -> str:
    """``"fail"`` if any finding is at or above ``fail_on``, ``"pass"`` otherwise."""
    return "fail" if any(fail_on.fails(f.severity) for f in findings) else "pass"


def shown_verdict(findings: Iterable[Finding], fail_on: FailOn) -> str:
    """The verdict a report shows: ``"fail"`` if any finding is an error or at or above
    ``fail_on``. ``--fail-on`` sets the exit code (``verdict``), never what the report says: a
    log with error findings read with ``--fail-on never`` exits 0 and still says FAIL."""
    items = list(findings)
    return "fail" if verdict(items, fail_on) == "fail" or verdict(items, FailOn.error) == "fail" else "pass"


@dataclass(frozen=True)
class RuleTable:
    """A command's finding codes: ``code -> (rule name, severity, what makes it fail)``."""

    codes: Mapping[str, tuple[str, Severity, str]]

    def finding(self, code: str, message: str, **evidence: Any) -> Finding:
        """A finding of ``code``; evidence that is ``None`` is left out."""
        rule, severity, _ = self.codes[code]
        return Finding(
            code=code,
            rule=rule,
            severity=severity,
            message=message,
            evidence={k: v for k, v in evidence.items() if v is not None},
        )

    def summaries(self, checked: Mapping[str, int], findings: Iterable[Finding]) -> list[RuleSummary]:
        """One summary per code, in table order: what it checked and how many findings it made."""
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
            for code, (rule, sev, desc) in self.codes.items()
        ]

    def markdown(self) -> str:
        """The rules table of the command's doc page."""
        lines = ["| code | rule | severity | fails when |", "|---|---|---|---|"]
        lines += [f"| {c} | {r} | {s.value} | {d} |" for c, (r, s, d) in self.codes.items()]
        return "\n".join(lines)
