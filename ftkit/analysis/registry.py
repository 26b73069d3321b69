"""The rule registry: every analyzer rule is a ``Rule`` subclass registered under its code.

A rule states its stable ``code`` (``FT101``), ``name``, default ``severity``, a one-line
``description`` and a ``fix`` (both rendered into docs/analyze-events.md and the reports).
It observes the replay through hooks, all optional:

- ``events``: event types routed to ``on_event(event, fi, line)`` as they are replayed: the
  event (a validated dict), the index of its file and its 1-based line number. Rules keep
  the pair cheaply and turn it into a location only when they report:
  ``self.report(msg, where=self.replay.where(fi, line))`` (evidence ``file`` and ``line``);
- ``on_step(record)``: a step attempt (``StepRecord``) was closed, i.e. every source has moved
  on from it, so its evidence is complete;
- ``on_rollout(record)``: a rollout (``RolloutRecord``) was closed;
- ``finish()``: the log ended.

It calls ``self.check(n)`` for what it checked and ``self.report(message, severity=None,
**evidence)`` for each finding; the finding carries the rule's ``hint()``: its ``fix``, unless the
rule words it for the producer that wrote the log (``ftkit train`` or the evidence API).
Rules read shared state (membership, run info) from ``self.replay``; they keep only state that
is bounded by open steps / rollouts, so memory does not grow with the log.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, Any, ClassVar

from ftkit.errors import UsageError
from ftkit.findings import Severity

if TYPE_CHECKING:
    from ftkit.analysis.records import RolloutRecord, StepRecord
    from ftkit.analysis.replay import Replay

RULES: dict[str, type[Rule]] = {}


class Rule:
    code: ClassVar[str]
    name: ClassVar[str]
    severity: ClassVar[Severity] = Severity.error
    description: ClassVar[str]
    fix: ClassVar[str]
    events: ClassVar[tuple[str, ...]] = ()

    def __init__(self, replay: Replay) -> None:
        self.replay = replay
        self.checked = 0
        self.found = 0

    def check(self, n: int = 1) -> None:
        """Count ``n`` things this rule checked (shown beside its findings in every report)."""
        self.checked += n

    def report(self, message: str, severity: Severity | None = None, **evidence: Any) -> None:
        """Record a finding; ``where=(file, line)`` in ``evidence`` becomes ``file``/``line``."""
        self.found += 1
        self.replay.add_finding(self, message, severity or self.severity, evidence)

    def hint(self) -> str:
        """The fix a finding carries: ``fix`` (the rules table's, for any producer), or a rule's
        own wording for the log's producer (``Replay.profile`` is set for a log of the evidence
        API, None for ``ftkit train``'s); called when a finding is stored."""
        return self.fix

    def on_event(self, event: dict[str, Any], fi: int, line: int) -> None:  # pragma: no cover
        raise NotImplementedError(f"{self.code} subscribes to {self.events} but has no on_event")

    def on_step(self, record: StepRecord) -> None:
        return None

    def on_rollout(self, record: RolloutRecord) -> None:
        return None

    def finish(self) -> None:
        return None


def register(cls: type[Rule]) -> type[Rule]:
    """Class decorator: add a rule to ``RULES`` (codes are unique)."""
    if cls.code in RULES:
        raise RuntimeError(f"rule {cls.code} registered twice")
    RULES[cls.code] = cls
    return cls


def all_rules() -> dict[str, type[Rule]]:
    """Every registered rule, by code, in code order (imports ``ftkit.analysis.rules.*``)."""
    import ftkit.analysis.rules as pkg

    for mod in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"{pkg.__name__}.{mod.name}")
    return dict(sorted(RULES.items()))


#: The rules that check the log itself (lines lost, cut, forged or malformed: FT111; evidence
#: owed and missing: FT112; commits that contradict each other: FT106). Whatever else a rule
#: selection asks for, these run: a rule that reads a damaged log proves nothing.
INTEGRITY = ("FT106", "FT111", "FT112")


def select_rules(select: list[str] | None = None, skip: list[str] | None = None) -> list[type[Rule]]:
    """The rules to run: ``select`` (default all) minus ``skip``, plus the ``INTEGRITY`` rules
    always. Unknown codes, skipping an integrity rule, and a selection that leaves no rule of its
    own (nothing asked for would be checked: never a pass) are a UsageError."""
    rules = all_rules()
    wanted = [c.strip().upper() for c in (select or [])]
    skipped = [c.strip().upper() for c in (skip or [])]
    unknown = sorted({c for c in wanted + skipped if c not in rules})
    if unknown:
        raise UsageError(f"unknown rule code(s): {', '.join(unknown)}", f"known rules: {', '.join(rules)}")
    codes = wanted or list(rules)
    chosen = {c for c in codes if c not in skipped}
    if not chosen:
        raise UsageError(
            "the rule selection leaves no rule to run (every selected rule is skipped)",
            "drop a --skip-rule, or --rule a code that is not skipped",
        )
    integrity = sorted(set(skipped) & set(INTEGRITY))
    if integrity:
        raise UsageError(
            f"{', '.join(integrity)} check(s) the log's integrity and always run(s); it cannot be skipped",
            f"drop --skip-rule {integrity[0]}: the other rules' verdicts rest on an intact log",
        )
    return [rules[c] for c in sorted(chosen | set(INTEGRITY))]
