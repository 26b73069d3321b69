"""The one output sink of every command: stdout carries data only, stderr everything else.

``Output`` is created by a command from its ``--format`` option. ``data``/``json`` write the
result to the data stream; ``info``/``warn`` go to stderr; ``progress`` shows progress on stderr in
human mode only: a Rich bar when stderr is a terminal or ``FTKIT_PROGRESS=1``, otherwise (a
CI log, a file) plain lines every ``PLAIN_EVERY`` seconds of long work (``PlainProgress``);
``FTKIT_PROGRESS=0`` turns both off.

Guarantees:

- **Data only on stdout.** ``ftkit.cli.main`` runs every command inside ``guard_stdout()``:
  the first ``Output`` a command creates moves the process's file descriptor 1 (and
  ``sys.stdout``) to stderr and keeps a private duplicate of the original stdout for data.
  Whatever a library prints afterwards (Ray's log monitor, the raylet and worker processes
  it starts, which inherit fd 1) lands on stderr. Help and usage text, printed before a
  command runs, are unaffected. ``guard_stdout`` restores everything when the command ends.
- **Strict JSON.** ``json`` writes RFC 8259 JSON: non-finite floats become the strings
  ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (``ftkit.report.escaping.strict_json``).
- **No raw control sequences.** Strings printed through the Rich consoles pass through
  ``escaping.terminal`` (ESC, CSI, BEL ... become visible ``\\xNN`` text).
- **No hard wrapping into files or pipes.** When the data stream is not a terminal, human
  output is rendered at an unbounded width (lines and tables are as long as their content).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from enum import Enum
from typing import IO, Any, cast

from rich.console import Console
from rich.text import Text

from ftkit.errors import FtkitError
from ftkit.report.escaping import strict_json, terminal


class Format(str, Enum):
    human = "human"
    json = "json"
    github = "github"


SCHEMA_VERSION = 1
PIPE_WIDTH = 1_000_000  # "unbounded": Rich needs a number


class _Guard:
    """State of ``guard_stdout``: armed by the CLI, engaged by the first ``Output``."""

    armed = False
    data: Any = None  # IO[str] or _DataStream
    saved_fd: int | None = None
    stdout: Any = None


def data_stream() -> IO[str]:
    """Where command data goes: the private duplicate of stdout when guarded, else ``sys.stdout``."""
    if not _Guard.armed:
        return sys.stdout
    if _Guard.data is None:
        _engage()
    return cast(IO[str], _Guard.data)


def _engage() -> None:
    original = sys.stdout
    if original is None or isinstance(original, _ClosedStdout):  # started with fd 1 closed (``>&-``)
        raise OutputUnwritable("it is closed")
    original.flush()
    _Guard.stdout = original
    try:
        out_fd, err_fd = original.fileno(), sys.stderr.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):  # not a real file (e.g. a test runner)
        _Guard.data = original
    else:
        _Guard.saved_fd = os.dup(out_fd)
        os.dup2(err_fd, out_fd)
        encoding = getattr(original, "encoding", None) or "utf-8"
        stream = open(_Guard.saved_fd, "w", encoding=encoding, errors="replace", closefd=False)  # noqa: SIM115
        _Guard.data = _DataStream(stream)
    sys.stdout = sys.stderr


class OutputUnwritable(FtkitError):
    """Standard output cannot take the data: closed (``>&-``), a full disk, an I/O error (exit 2)."""

    def __init__(self, why: str) -> None:
        super().__init__(
            f"cannot write the output to standard output: {why}",
            hint="give the command a writable stdout (a file with free space, a pipe, or /dev/null)",
        )


class OutputClosed(Exception):
    """The reader of stdout went away (``ftkit ... | head``); ``ftkit.cli.main`` ends quietly.

    Not an ``OSError``, so no library (Click maps EPIPE to exit 1) mistakes it for a failure."""


class _ClosedStdout(io.TextIOBase):
    """``sys.stdout`` of a process started with fd 1 closed: every write is ``OutputUnwritable``."""

    def write(self, text: str) -> int:
        raise OutputUnwritable("it is closed")

    def flush(self) -> None:
        return None


class _DataStream:
    """The private stdout of a guarded command: a text stream whose writes raise
    ``OutputClosed`` instead of ``BrokenPipeError``."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise OutputClosed() from None
        except OSError as exc:
            raise OutputUnwritable(exc.strerror or str(exc)) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise OutputClosed() from None
        except OSError as exc:
            raise OutputUnwritable(exc.strerror or str(exc)) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def guard_stdout() -> Iterator[None]:
    """Arm the stdout guard for one command run (used by ``ftkit.cli.main``); see the module doc.
    Data that cannot be written (a full disk, an I/O error) is ``OutputUnwritable`` (exit 2),
    also when the last of it fails in the final flush; a reader that went away is not."""
    _Guard.armed = True
    real = sys.stdout  # help and --version text is written here directly, through the same checks
    sys.stdout = _DataStream(real) if real is not None else _ClosedStdout()
    unwritten: OutputUnwritable | None = None
    try:
        yield
    finally:
        _Guard.armed = False
        data, _Guard.data = _Guard.data, None
        if data is not None:
            try:
                data.flush()
            except OutputUnwritable as exc:
                unwritten = exc
            except (OSError, OutputClosed):  # a closed pipe must not stop the restore
                pass
            sys.stdout = _Guard.stdout
            if _Guard.saved_fd is not None:
                with contextlib.suppress(OSError, OutputClosed):
                    sys.stdout.flush()
                    data.close()
                os.dup2(_Guard.saved_fd, sys.stdout.fileno())
                os.close(_Guard.saved_fd)
                _Guard.saved_fd = None
        sys.stdout = real
    if unwritten is not None:  # reached only when the command itself ended without an exception
        raise unwritten


class _SafeConsole(Console):
    """A Rich console that makes control characters in printed strings visible and never turns
    ``:name:`` codes into emoji (names from inputs print as written)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("emoji", False)
        super().__init__(**kwargs)

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(terminal(text), **kwargs)


class Output:
    def __init__(self, fmt: Format = Format.human) -> None:
        self.format = fmt
        self.stream = data_stream()
        self.err = _SafeConsole(stderr=True, highlight=False, soft_wrap=True)
        tty = _isatty(self.stream)
        self.out = _SafeConsole(file=self.stream, highlight=False, soft_wrap=not tty, width=None if tty else PIPE_WIDTH)

    @property
    def human(self) -> bool:
        return self.format is Format.human

    def data(self, text: str) -> None:
        """Write plain data to stdout (never through Rich)."""
        self.stream.write(text if text.endswith("\n") else text + "\n")
        self.stream.flush()

    def json(self, payload: dict[str, Any]) -> None:
        """Write a strict JSON document to stdout; ``schema_version`` is added when absent."""
        doc = strict_json({"schema_version": SCHEMA_VERSION, **payload})
        self.data(json.dumps(doc, indent=2, allow_nan=False))

    def info(self, message: str) -> None:
        """A Rich-markup line on stderr (printed as plain text if the markup does not parse,
        e.g. when an interpolated path holds ``[/x]``)."""
        from rich.errors import MarkupError

        try:
            self.err.print(message, markup=True)
        except MarkupError:
            self.err.print(message, markup=False)

    def warn(self, message: str) -> None:
        """``Warning: message`` on stderr (``message`` is plain text, not markup)."""
        self.err.print(Text.assemble(("Warning:", "yellow"), " ", terminal(message)))

    @contextlib.contextmanager
    def progress(self, description: str, total: float | None) -> Iterator[ProgressTask]:
        """Progress on stderr in human mode (see the module docstring): a bar on an interactive
        stderr or with FTKIT_PROGRESS=1, plain periodic lines on any other stderr, nothing with
        FTKIT_PROGRESS=0 or in a machine format."""
        setting = os.environ.get("FTKIT_PROGRESS")
        if not self.human or setting == "0":
            yield ProgressTask(None, None)
            return
        if not (self.err.is_terminal or setting == "1"):
            plain = PlainProgress(lambda line: self.err.print(line, markup=False), description, total)
            yield plain
            plain.close()
            return
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        console = self.err if self.err.is_terminal else _SafeConsole(stderr=True, force_terminal=True)
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
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


PLAIN_EVERY = 10.0  # seconds between plain progress lines


class PlainProgress(ProgressTask):
    """Progress for a log that is not a terminal (CI): ``<description>: <done> of <total> (<pct>%),
    <elapsed> s`` (``<done> so far`` without a total) through ``write`` at most every ``every``
    seconds of ``clock``, the first after ``every`` seconds, so work shorter than that prints
    nothing; ``close`` ends work that printed a line with ``<description>: done, <elapsed> s``."""

    def __init__(
        self,
        write: Callable[[str], None],
        description: str,
        total: float | None,
        every: float = PLAIN_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(None, None)
        self._write, self._description, self._every, self._clock = write, description, every, clock
        self.total, self.completed, self.lines = total, 0.0, 0
        self._start = self._last = clock()

    def advance(self, amount: float = 1) -> None:
        self.completed += amount
        self._tick()

    def update(self, **kwargs: Any) -> None:
        """Takes Rich's ``completed`` and ``total``; other fields are ignored."""
        self.completed = float(kwargs.get("completed", self.completed))
        self.total = kwargs.get("total", self.total)
        self._tick()

    def close(self) -> None:
        if self.lines:
            self._emit(f"{self._description}: done, {self._clock() - self._start:.0f} s")

    def _tick(self) -> None:
        now = self._clock()
        if now - self._last < self._every:
            return
        self._last = now
        done = f"{self.completed:,.0f}"
        if self.total:
            done += f" of {self.total:,.0f} ({100 * self.completed / self.total:.0f}%)"
        else:
            done += " so far"
        self._emit(f"{self._description}: {done}, {now - self._start:.0f} s")

    def _emit(self, line: str) -> None:
        self.lines += 1
        with contextlib.suppress(OSError, ValueError):  # a stderr that went away loses the line only
            self._write(line)


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
