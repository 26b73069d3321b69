"""Expected evidence from what the writers and the driver declared, never from what is present.

A log that lost lines at a line boundary looks complete line by line: no seq gap, no partial
line. What tells it apart is what its writers and the driver said (DESIGN.md I6):

- **log_closed** (schema 2): every writer that closes normally writes it as its last line, with
  the number of lines it emitted before. A schema 2 stream that ends without it was cut -- unless
  the driver declared the writer's cell dead (``errored`` or ``failed``) or its engine failed
  (``engine_failed``) after the stream began,
  or a ``run_resumed`` after it began says its whole session ended (``ftkit.analysis.resumed``),
  or the stream itself logged a ``fault_injected`` that kills its process (an engine has no cell). A
  line after ``log_closed``, or a ``lines`` count that is not the line's ``seq``, is damage too.
- **declared steps**: the driver logs a ``metric`` with the ``step`` of every step it trained; a
  declared step of which no rank logged anything lost all its evidence (FT112).

Schema 1 streams (written before ``log_closed`` existed) are read without the first check. Memory:
one entry per stream, one per ``errored`` declaration, and one byte per step number up to
``MAX_STEPS`` (a bitmap of declared and seen steps).
"""

from __future__ import annotations

from typing import Any

from ftkit.analysis.records import Where

KILLING = frozenset({"kill", "sigkill", "exit", "hang"})  # fault kinds after which a process cannot close
MAX_STEPS = 1 << 24  # step numbers above this are not tracked (an invalid log says so elsewhere)
_DECLARED, _SEEN = 1, 2


class Closure:
    """Per-stream closure state and the driver's declarations; see the module docstring."""

    def __init__(self) -> None:
        self.closed: list[bool] = []
        self.killed: list[bool] = []  # the stream itself logged a fault that ends its process
        self.schema: list[Any] = []
        # (source, cell, engine, first time, last line, last step)
        self.unclosed: list[tuple[dict[str, Any], int | None, int | None, float, Where, Any]] = []
        self.errored: dict[int, list[float]] = {}
        self.engines_failed: dict[int, list[float]] = {}
        self.resumes: list[float] = []  # times of run_resumed: every stream begun before ended with its session
        self.steps = bytearray()

    def attach(self, streams: int) -> None:
        self.closed = [False] * streams
        self.killed = [False] * streams
        self.schema = [None] * streams

    def started(self, fi: int, ev: dict[str, Any]) -> None:
        self.schema[fi] = ev.get("schema")

    def ended(self, fi: int, src: dict[str, Any] | None, first_time: float, where: Where, step: Any = None) -> None:
        """Stream ``fi`` ended at ``where`` (its last line), ``step`` the last step it logged (None: none)."""
        if self.closed[fi] or self.killed[fi] or src is None or type(self.schema[fi]) is not int or self.schema[fi] < 2:
            return
        cell = src.get("cell") if src.get("role") == "trainer" else None
        engine = src.get("rank") if src.get("role") == "engine" else None
        cell, engine = (v if type(v) is int else None for v in (cell, engine))
        self.unclosed.append((src, cell, engine, first_time, where, step))

    def fault(self, fi: int, kind: Any) -> None:
        """Stream ``fi`` logged ``fault_injected``: a killing kind excuses its missing ``log_closed``."""
        if kind in KILLING:
            self.killed[fi] = True

    def resumed(self, time: float) -> None:
        """A later session of the run began at ``time`` (``run_resumed``)."""
        self.resumes.append(time)

    def declared_dead(self, cell: int, time: float) -> None:
        self.errored.setdefault(cell, []).append(time)

    def engine_failed(self, engine: int, time: float) -> None:
        """The driver logged ``engine_failed`` for ``engine`` at ``time``."""
        self.engines_failed.setdefault(engine, []).append(time)

    def mark_step(self, step: Any, flag: int) -> None:
        if type(step) is not int or not 0 <= step < MAX_STEPS:
            return
        if step >= len(self.steps):
            self.steps.extend(bytes(max(step + 1 - len(self.steps), len(self.steps))))
        self.steps[step] |= flag

    def declare_step(self, step: Any) -> None:
        self.mark_step(step, _DECLARED)

    def see_step(self, step: Any) -> None:
        self.mark_step(step, _SEEN)

    def cut_streams(self) -> list[tuple[dict[str, Any], Any, Where]]:
        """Schema 2 streams that ended without ``log_closed`` and whose process the driver did not
        declare dead after the stream began: (source, last step logged or None, last line)."""
        cut = []
        for src, cell, engine, first, where, step in self.unclosed:
            if cell is not None and any(t >= first for t in self.errored.get(cell, ())):
                continue
            if engine is not None and any(t >= first for t in self.engines_failed.get(engine, ())):
                continue
            if any(t >= first for t in self.resumes):
                continue
            cut.append((src, step, where))
        return cut

    def lost_steps(self) -> list[int]:
        """Steps the driver declared of which no rank logged anything."""
        return [step for step, flags in enumerate(self.steps) if flags == _DECLARED]


def stream_label(src: dict[str, Any], ddp: bool) -> str:
    """A writer as a reader names it: ``the driver``, ``rank 1`` (a log of the evidence API,
    ``ddp``: one trainer per torch rank) or ``trainer cell 1 rank 0`` (``ftkit train``),
    ``engine 0``; ``(incarnation N)`` after a restart."""
    role, inc = src.get("role"), src.get("incarnation")
    if role == "driver":
        name = "the driver"
    elif role == "trainer":
        name = f"rank {src.get('cell')}" if ddp else f"trainer cell {src.get('cell')} rank {src.get('rank')}"
    else:
        name = f"{role} {src.get('rank')}" if src.get("rank") is not None else str(role)
    return name + (f" (incarnation {inc})" if type(inc) is int and inc > 0 else "")
