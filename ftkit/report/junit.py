"""JUnit XML: one test case per rule (or per checked item), failing with its findings.

CI systems display these natively. The suite name is the command (``ftkit.analyze-events``).
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path

from ftkit.analysis.findings import Finding, RuleSummary


def write_junit(
    path: str | os.PathLike[str], suite: str, rules: Iterable[RuleSummary], findings: Iterable[Finding]
) -> None:
    """Write ``path`` atomically: one ``testcase`` per rule, a ``failure`` per finding."""
    rules = list(rules)
    by_code: dict[str, list[Finding]] = {}
    for f in findings:
        by_code.setdefault(f.code, []).append(f)
    failed = sum(1 for r in rules if by_code.get(r.code))
    root = ET.Element("testsuites")
    ts = ET.SubElement(
        root, "testsuite", name=suite, tests=str(len(rules)), failures=str(failed), errors="0", skipped="0"
    )
    for r in rules:
        tc = ET.SubElement(ts, "testcase", classname=suite, name=f"{r.code} {r.rule}")
        for f in by_code.get(r.code, []):
            fail = ET.SubElement(tc, "failure", message=f.message, type=f.severity.value)
            fail.text = "\n".join(f"{k}: {v}" for k, v in f.evidence.items())
    known = {r.code for r in rules}
    for code, fs in by_code.items():  # findings of codes without a rule summary still show
        if code not in known:
            tc = ET.SubElement(ts, "testcase", classname=suite, name=f"{code} {fs[0].rule}")
            for f in fs:
                ET.SubElement(tc, "failure", message=f.message, type=f.severity.value)
    _write(root, path)


def write_junit_cases(
    path: str | os.PathLike[str], suite: str, cases: Iterable[tuple[str, str, list[tuple[str, str]]]]
) -> None:
    """Write ``path`` atomically with one ``testcase`` per checked item.

    ``cases`` are ``(classname, name, failures)``; each failure is ``(message, text)`` and
    fails the case. Used where a command checks many items (compare-dumps: one case per tensor).
    """
    cases = list(cases)
    root = ET.Element("testsuites")
    ts = ET.SubElement(
        root,
        "testsuite",
        name=suite,
        tests=str(len(cases)),
        failures=str(sum(1 for c in cases if c[2])),
        errors="0",
        skipped="0",
    )
    for classname, name, failures in cases:
        tc = ET.SubElement(ts, "testcase", classname=classname, name=name)
        for message, text in failures:
            ET.SubElement(tc, "failure", message=message, type="error").text = text
    _write(root, path)


def _write(root: ET.Element, path: str | os.PathLike[str]) -> None:
    tree = ET.ElementTree(root)
    ET.indent(tree)
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    tree.write(tmp, encoding="utf-8", xml_declaration=True)
    os.replace(tmp, target)
