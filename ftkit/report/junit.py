"""JUnit XML: one test case per rule (or per checked item), failing with its findings.

CI systems display these natively. The suite name is the command (``ftkit.analyze-events``).
The document is well-formed for any input: every name, message and evidence value passes
through ``xml_text`` (characters XML 1.0 cannot hold become visible escapes) and the XML
writer escapes markup. It follows the common JUnit schema (``testsuites > testsuite >
testcase > failure | skipped``, with ``tests``/``failures``/``errors``/``skipped`` counts).
"""

from __future__ import annotations

import io
import math
import os
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ftkit.findings import Finding, RuleSummary
from ftkit.report.escaping import xml_text
from ftkit.report.report_file import write_report_file

NOT_RUN = "not run: the rule checked 0 items (the input holds no evidence it applies to)"


@dataclass
class Failure:
    message: str
    type: str = "error"
    text: str = ""


@dataclass
class Case:
    classname: str
    name: str
    failures: list[Failure] = field(default_factory=list)
    skipped: str | None = None  # why the case did not run (JUnit ``<skipped message=...>``): never a pass
    seconds: float | None = None  # what its rule / comparison took (None: not timed on its own)


def finding_failure(f: Finding) -> Failure:
    """A finding as a JUnit failure: message, severity as type, evidence and fix as the body."""
    body = [f"{k}: {v}" for k, v in f.evidence.items()]
    if f.fix:
        body.append(f"how to fix: {f.fix}")
    return Failure(f"{f.code} {f.rule}: {f.message}", f.severity.value, "\n".join(body))


def rule_cases(
    suite: str,
    rules: Iterable[RuleSummary],
    findings: Iterable[Finding],
    seconds: Mapping[str, float] | None = None,
) -> list[Case]:
    """One case per rule, failing with each of its findings, skipped when the rule checked nothing
    (``RuleSummary.status`` "not run": no evidence is not a pass); findings of codes without a rule
    summary get a case of their own, so nothing is dropped. ``seconds``: each rule's time by code
    (its case's ``time``)."""
    seconds = seconds or {}
    by_code: dict[str, list[Finding]] = {}
    for f in findings:
        by_code.setdefault(f.code, []).append(f)
    cases = [
        Case(
            suite,
            f"{r.code} {r.rule}",
            [finding_failure(f) for f in by_code.pop(r.code, [])],
            NOT_RUN if r.status == "not run" else r.not_covered if r.status == "not covered" else None,
            seconds.get(r.code),
        )
        for r in rules
    ]
    cases += [Case(suite, f"{code} {fs[0].rule}", [finding_failure(f) for f in fs]) for code, fs in by_code.items()]
    return cases


def write_junit(path: str | os.PathLike[str], suite: str, cases: Iterable[Case], seconds: float | None = None) -> None:
    """Write the JUnit XML to ``path`` (``ftkit.report.report_file``: atomically; special files in place).

    Valid for Ant/Jenkins-style and Surefire-style consumers alike: every ``testcase`` has a
    ``time``, the seconds its rule or comparison took (``Case.seconds``, rounded up to the
    millisecond; ``0`` for a case not timed on its own), the suite's ``time`` is ``seconds`` (the
    command's work, reading included) and never less than the sum of its cases', and each case
    holds at most one ``<failure>`` (a case with several findings gets one failure whose message
    names the first and counts the rest, all of them in its text) or one ``<skipped>``, so the
    ``failures`` and ``skipped`` counts equal the elements a consumer counts."""
    cases = list(cases)
    failed = sum(1 for c in cases if c.failures)
    millis = [_millis(c.seconds) for c in cases]
    total = max(_millis(seconds), sum(millis))  # never under its cases'
    counts = {"tests": str(len(cases)), "failures": str(failed), "errors": "0", "time": _time(total)}
    root = ET.Element("testsuites", counts)
    skipped = sum(1 for c in cases if c.skipped is not None and not c.failures)
    ts = ET.SubElement(root, "testsuite", {"name": xml_text(suite), **counts, "skipped": str(skipped)})
    for case, ms in zip(cases, millis):
        tc = ET.SubElement(ts, "testcase", classname=xml_text(case.classname), name=xml_text(case.name), time=_time(ms))
        if case.failures:
            fail = _one_failure(case.failures)
            el = ET.SubElement(tc, "failure", message=xml_text(fail.message), type=xml_text(fail.type))
            el.text = xml_text(fail.text) if fail.text else None
        elif case.skipped is not None:
            ET.SubElement(tc, "skipped", message=xml_text(case.skipped))
    tree = ET.ElementTree(root)
    ET.indent(tree)
    buf = io.BytesIO()
    tree.write(buf, encoding="utf-8", xml_declaration=True)
    write_report_file(Path(path), buf.getvalue())


def _millis(seconds: float | None) -> int:
    """``seconds`` in whole milliseconds, rounded up: work that took any time shows (0: none or untimed)."""
    return 0 if not seconds or seconds < 0 else math.ceil(seconds * 1000)


def _time(ms: int) -> str:
    """A JUnit ``time`` of ``ms`` milliseconds: the resolution Surefire's schema takes (its
    pattern allows 3 decimals); ``0`` when not timed."""
    return f"{ms // 1000}.{ms % 1000:03d}" if ms else "0"


def _one_failure(failures: list[Failure]) -> Failure:
    """A case's failures as one: the first's message and type (findings come most severe first),
    ``(+N more)``, and every failure's message and text in the body."""
    if len(failures) == 1:
        return failures[0]
    body = "\n\n".join(f.message + (f"\n{f.text}" if f.text else "") for f in failures)
    first = failures[0]
    return Failure(f"{first.message} (+{len(failures) - 1} more)", first.type, body)
