"""``PhaseTimer``: wall seconds per named phase of one training step, for the ``phases`` object of
a step's ``metric`` event (docs/event-schema.md, docs/train.md "Where a step's time goes").

Contract: the clock is ``time.perf_counter`` (monotonic, host side, a few tens of nanoseconds a
reading) and a timer never synchronises a device: on CUDA a phase measures the host's time in it,
so kernels it only queued are paid for where the host next waits for the device (ftkit's trainer
waits once per step, when it copies the micro-shard losses to the host: that wait is counted in
``forward_backward``'s total, not in any one micro-shard's seconds).

``lap(phase)`` adds the seconds since the last mark (construction, ``mark()`` or the previous
``lap``) to ``phase`` and returns them; ``lap(None)`` measures without recording. Consecutive laps
therefore cover a stretch of code without a gap; ``phase(name)`` times one ``with`` block.
``seconds`` is the ``{phase: seconds}`` mapping so far (phases in the order first lapped).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class PhaseTimer:
    """Seconds per phase (see the module docstring)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._mark = time.perf_counter()

    def mark(self) -> None:
        """Start the next lap now."""
        self._mark = time.perf_counter()

    def lap(self, phase: str | None) -> float:
        """The seconds since the last mark, added to ``phase`` (``None``: not recorded)."""
        now = time.perf_counter()
        spent, self._mark = now - self._mark, now
        if phase is not None:
            self.add(phase, spent)
        return spent

    def add(self, phase: str, seconds: float) -> None:
        """Add ``seconds`` to ``phase``."""
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the ``with`` block into ``name`` (also when it raises)."""
        self.mark()
        try:
            yield
        finally:
            self.lap(name)
