"""Test support: check a JUnit file as two kinds of consumer read it.

``check_junit(path)`` parses the file with expat and libxml2, validates the whole document
against ``junit.xsd`` (Ant / Jenkins / GitLab structure) and every ``testsuite`` against
``surefire.xsd`` (Surefire's stricter rules: ``testcase/@time`` required, at most one
``skipped``), and asserts that each suite's counts equal the elements a consumer counts.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from lxml import etree

_HERE = Path(__file__).parent
_SCHEMAS: dict[str, etree.XMLSchema] = {}


def _schema(name: str) -> etree.XMLSchema:
    if name not in _SCHEMAS:
        _SCHEMAS[name] = etree.XMLSchema(etree.parse(str(_HERE / name)))
    return _SCHEMAS[name]


def check_junit(path: Path) -> ET.Element:
    """The parsed root of ``path`` after the checks in the module docstring."""
    root = ET.parse(path).getroot()  # expat
    doc = etree.parse(str(path))  # libxml2
    jenkins, surefire = _schema("junit.xsd"), _schema("surefire.xsd")
    assert jenkins.validate(doc), jenkins.error_log
    for suite in doc.getroot().iter("testsuite"):
        one = etree.ElementTree(etree.fromstring(etree.tostring(suite)))
        assert surefire.validate(one), surefire.error_log
    for suite in root.iter("testsuite"):
        cases = suite.findall("testcase")
        assert suite.get("tests") == str(len(cases))
        assert suite.get("failures") == str(len(suite.findall("testcase/failure")))
        assert suite.get("failures") == str(sum(1 for c in cases if c.find("failure") is not None))
        assert suite.get("skipped") == str(len(suite.findall("testcase/skipped")))
        assert suite.get("errors") == str(len(suite.findall("testcase/error")))
    return root
