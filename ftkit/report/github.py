"""GitHub Actions output: workflow-command annotations and the step summary.

Workflow commands are parsed line by line by the runner, so every field is escaped per its
rules: message data (``%``, ``\\r``, ``\\n``) and properties additionally (``:``, ``,``). A
finding can therefore never start a line of its own, whatever its tensor or file names hold.

``file=`` is relative to ``$GITHUB_WORKSPACE`` (or the current directory), so annotations
attach to repository files; a location outside it is named in the message instead. GitHub
shows at most 10 annotations of a kind per step, so ``workflow_commands`` emits at most
``MAX_ANNOTATIONS`` lines in all: the most severe findings, one line counting the rest, and
the verdict line.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from ftkit.findings import Finding
from ftkit.report.escaping import md_cell, terminal

MAX_ANNOTATIONS = 10
_LEVEL = {"error": "error", "warning": "warning", "info": "notice"}


def escape_data(text: str) -> str:
    """The message part of a workflow command."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A property value (``file=``, ``title=``) of a workflow command (control characters
    made visible first, as in messages)."""
    return escape_data(terminal(text)).replace(":", "%3A").replace(",", "%2C")


def workspace_path(file: str, root: str | None = None) -> str | None:
    """``file`` relative to the workspace root (POSIX separators), or None when outside it."""
    base = Path(root or os.environ.get("GITHUB_WORKSPACE") or os.getcwd()).resolve()
    try:
        rel = Path(file).resolve().relative_to(base)
    except (ValueError, OSError, RuntimeError):
        return None
    return rel.as_posix()


def annotation(f: Finding, root: str | None = None) -> str:
    """One ``::error``/``::warning``/``::notice`` line for a finding."""
    props = []
    message = f.message
    file, line = f.evidence.get("file"), f.evidence.get("line")
    if file:
        rel = workspace_path(str(file), root)
        if rel is None:
            message = f"{f.where()}: {message}"
        else:
            props.append(f"file={escape_property(rel)}")
            if isinstance(line, int) and not isinstance(line, bool):
                props.append(f"line={line}")
    props.append(f"title={escape_property(f'{f.code} {f.rule}')}")
    if f.fix:
        message = f"{message}\nHow to fix: {f.fix}"
    return f"::{_LEVEL[f.severity.value]} {','.join(props)}::{escape_data(terminal(message))}"


def workflow_commands(findings: Sequence[Finding], title: str, summary: str, failed: bool) -> str:
    """The annotations of ``findings`` (already sorted, most severe first), capped, and the verdict.

    At most ``MAX_ANNOTATIONS`` lines: when there are more findings than fit, the last finding
    slots give way to one ``::warning`` that counts those not annotated.
    """
    room = MAX_ANNOTATIONS - 1
    shown = list(findings) if len(findings) <= room else list(findings[: room - 1])
    lines = [annotation(f) for f in shown]
    rest = len(findings) - len(shown)
    if rest:
        lines.append(
            f"::warning title={escape_property(title)}::"
            f"{rest} more finding(s) not annotated (GitHub shows {MAX_ANNOTATIONS} per step); "
            "see the step summary or --format json"
        )
    level = "error" if failed else "notice"
    lines.append(f"::{level} title={escape_property(title)}::{escape_data(terminal(summary))}")
    return "\n".join(lines)


def append_step_summary(markdown: str | Callable[[], str]) -> bool:
    """Append to ``$GITHUB_STEP_SUMMARY``; returns whether it was set. ``markdown`` may be a
    callable, which is only called when the summary is written."""
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return False
    text = markdown() if callable(markdown) else markdown
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(text.rstrip("\n") + "\n\n")
    return True


def markdown_table(header: Sequence[str], rows: Iterable[Iterable[object]]) -> str:
    """A GitHub-flavoured Markdown table; every cell is escaped (``md_cell``)."""
    lines = ["| " + " | ".join(md_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(md_cell(c) for c in row) + " |")
    return "\n".join(lines)
