"""GitHub Actions output: workflow-command annotations and the step summary.

``annotation_lines`` turns findings into ``::error``/``::warning``/``::notice`` lines (one per
finding, with ``file``/``line`` when the evidence has them). ``append_step_summary`` appends
Markdown to ``$GITHUB_STEP_SUMMARY`` when that variable is set.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from ftkit.analysis.findings import Finding

_LEVEL = {"error": "error", "warning": "warning", "info": "notice"}


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_prop(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(f: Finding) -> str:
    props = [f"title={_escape_prop(f'{f.code} {f.rule}')}"]
    if f.evidence.get("file"):
        props.insert(0, f"file={_escape_prop(str(f.evidence['file']))}")
        if f.evidence.get("line") is not None:
            props.insert(1, f"line={int(f.evidence['line'])}")
    return f"::{_LEVEL[f.severity.value]} {','.join(props)}::{_escape_data(f.message)}"


def annotation_lines(findings: Iterable[Finding]) -> str:
    return "\n".join(annotation(f) for f in findings)


def append_step_summary(markdown: str) -> bool:
    """Append to ``$GITHUB_STEP_SUMMARY``; returns whether it was set."""
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return False
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(markdown.rstrip("\n") + "\n\n")
    return True


def markdown_table(header: list[str], rows: Iterable[Iterable[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |")
    return "\n".join(lines)
