"""The one output sink of every command: stdout carries data only, stderr everything else.

``Output`` is created by a command from its ``--format`` option. ``data``/``json`` write the
result to stdout; ``info``/``warn``/``hint`` go to stderr; ``progress`` shows a Rich progress
bar on stderr in human mode only (and only when stderr is a terminal, unless forced).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from enum import Enum
from typing import Any

from rich.console import Console


class Format(str, Enum):
    human = "human"
    json = "json"
    github = "github"


SCHEMA_VERSION = 1


class Output:
    def __init__(self, fmt: Format = Format.human) -> None:
        self.format = fmt
        self.err = Console(stderr=True, highlight=False, soft_wrap=True)
        # Human data goes through Rich to stdout; width from the terminal, wide when piped.
        self.out = Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 140)

    @property
    def human(self) -> bool:
        return self.format is Format.human

    def data(self, text: str) -> None:
        """Write plain data to stdout (never through Rich)."""
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()

    def json(self, payload: dict[str, Any]) -> None:
        """Write a JSON document to stdout; ``schema_version`` is added when absent."""
        doc = {"schema_version": SCHEMA_VERSION, **payload}
        self.data(json.dumps(doc, indent=2, default=_json_default, allow_nan=True))

    def info(self, message: str) -> None:
        self.err.print(message, markup=True)

    def warn(self, message: str) -> None:
        self.err.print(f"[yellow]Warning:[/yellow] {message}", markup=True)

    @contextlib.contextmanager
    def progress(self, description: str, total: float | None) -> Iterator[ProgressTask]:
        """A progress bar on stderr (human mode, interactive stderr or FTKIT_PROGRESS=1)."""
        show = self.human and (self.err.is_terminal or os.environ.get("FTKIT_PROGRESS") == "1")
        if not show:
            yield ProgressTask(None, None)
            return
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.err,
            transient=True,
        ) as bar:
            yield ProgressTask(bar, bar.add_task(description, total=total))


class ProgressTask:
    """Handle returned by ``Output.progress``; a no-op when no bar is shown."""

    def __init__(self, bar: Any, task: Any) -> None:
        self._bar, self._task = bar, task

    def advance(self, amount: float = 1) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, amount)

    def update(self, **kwargs: Any) -> None:
        if self._bar is not None:
            self._bar.update(self._task, **kwargs)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    if hasattr(obj, "__fspath__"):
        return os.fspath(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
