"""JUnit XML: one test case per rule (or per checked item), failing with its findings.

CI systems display these natively. The suite name is the command (``ftkit.analyze-events``).
The document is well-formed for any input: every name, message and evidence value passes
through ``xml_text`` (characters XML 1.0 cannot hold become visible escapes) and the XML
writer escapes markup. It follows the common JUnit schema (``testsuites > testsuite >
testcase > failure``, with ``tests``/``failures``/``errors``/``skipped`` counts).
"""

from __future__ import annotations

import io
import os
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ftkit.findings import Finding, RuleSummary
from ftkit.report.escaping import xml_text
from ftkit.report.report_file import write_report_file


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
    skipped: str | None = None  # why the case could not run (a rule not covered): never a pass


def finding_failure(f: Finding) -> Failure:
    """A finding as a JUnit failure: message, severity as type, evidence and fix as the body."""
    body = [f"{k}: {v}" for k, v in f.evidence.items()]
    if f.fix:
        body.append(f"how to fix: {f.fix}")
    return Failure(f"{f.code} {f.rule}: {f.message}", f.severity.value, "\n".join(body))


def rule_cases(suite: str, rules: Iterable[RuleSummary], findings: Iterable[Finding]) -> list[Case]:
    """One case per rule, failing with each of its findings; findings of codes without a rule
    summary get a case of their own, so nothing is dropped."""
    by_code: dict[str, list[Finding]] = {}
    for f in findings:
        by_code.setdefault(f.code, []).append(f)
    cases = [
        Case(suite, f"{r.code} {r.rule}", [finding_failure(f) for f in by_code.pop(r.code, [])], r.not_covered)
        for r in rules
    ]
    cases += [Case(suite, f"{code} {fs[0].rule}", [finding_failure(f) for f in fs]) for code, fs in by_code.items()]
    return cases


def write_junit(path: str | os.PathLike[str], suite: str, cases: Iterable[Case]) -> None:
    """Write the JUnit XML to ``path`` (``ftkit.report.report_file``: atomically; special files in place)."""
    cases = list(cases)
    root = ET.Element("testsuites")
    ts = ET.SubElement(
        root,
        "testsuite",
        name=xml_text(suite),
        tests=str(len(cases)),
        failures=str(sum(1 for c in cases if c.failures)),
        errors="0",
        skipped=str(sum(1 for c in cases if c.skipped and not c.failures)),
    )
    for case in cases:
        tc = ET.SubElement(ts, "testcase", classname=xml_text(case.classname), name=xml_text(case.name))
        for fail in case.failures:
            el = ET.SubElement(tc, "failure", message=xml_text(fail.message), type=xml_text(fail.type))
            el.text = xml_text(fail.text) if fail.text else None
        if case.skipped and not case.failures:
            ET.SubElement(tc, "skipped", message=xml_text(case.skipped))
    tree = ET.ElementTree(root)
    ET.indent(tree)
    buf = io.BytesIO()
    tree.write(buf, encoding="utf-8", xml_declaration=True)
    write_report_file(Path(path), buf.getvalue())
