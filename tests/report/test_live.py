"""The live view of ``ftkit train`` (``ftkit.report.live``) with a fake feed: in place on a
pseudo-terminal, plain lines on a pipe-like stream."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import struct
import termios
from dataclasses import dataclass, field

from ftkit.report.live import LiveView, live_view
from ftkit.report.sink import Format, Output


@dataclass
class Report:
    rollout: int
    rollouts: int
    step: int
    steps: int
    committed: bool
    loss: float
    grad_norm: float
    reward: float
    tokens_per_s: float
    cells_alive: int
    cells: int
    attempts: int = 1
    metrics: dict[str, float] = field(default_factory=dict)


def _feed(view: LiveView) -> None:
    for c in range(3):
        view.on_cell_state(c, "alive", "ready")
    view.on_step(Report(0, 2, 0, 4, True, 0.5, 1.0, 0.25, 1200.0, 3, 3))
    view.on_fault("kill at backward, cell 2 rank 0, step 1")
    view.on_cell_state(2, "failed", "rank died")
    view.on_step(Report(0, 2, 1, 4, False, 0.4, 1.1, 0.25, 900.0, 2, 3))
    view.on_cell_state(2, "healing", "from cell 0")
    view.on_heal("cell 2 from cell 0: 12.0 MiB in 0.8s")
    view.on_cell_state(2, "alive", "healed")
    view.on_step(Report(1, 2, 2, 4, True, 0.375, 0.9, 0.5, 1500.0, 3, 3, attempts=2))


def test_plain_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    with LiveView(4, 3, live=False, stream=out) as view:
        _feed(view)
    lines = out.getvalue().splitlines()
    assert "\x1b" not in out.getvalue() and len(lines) == 11
    assert lines[3].startswith("rollout 1/2  step 1/4  loss +0.50000  reward 0.250")
    assert lines[4] == "fault: kill at backward, cell 2 rank 0, step 1"
    assert lines[6].endswith("cells 2/3  900 tok/s  DISCARDED")
    assert "heal: cell 2 from cell 0: 12.0 MiB in 0.8s" in lines


def _read_all(fd: int) -> str:
    chunks = []
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO once the other side is closed and drained
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks).decode("utf-8", "replace")


def test_live_on_a_pseudo_terminal() -> None:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 110, 0, 0))
    with os.fdopen(slave, "w", encoding="utf-8", closefd=True) as tty:
        assert tty.isatty()
        with LiveView(4, 3, live=True, stream=tty) as view:
            _feed(view)
            mid = view._render()
        tty.flush()
    text = _read_all(master)
    os.close(master)
    assert "\x1b[" in text  # drawn in place: cursor movement / erase sequences
    assert re.search(r"\x1b\[\d*A|\x1b\[2K", text)  # redraws over the previous frame
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    final = plain[plain.rindex("ftkit train") :]  # the last frame stays on screen
    assert "rollout 2/2" in final and "step 3/4" in final and "3/3 alive" in final
    assert "reward 0.500" in final and "loss +0.37500" in final and "discarded attempts 1" in final
    assert "last fault kill at backward, cell 2 rank 0, step 1 -> cell 2 failed (rank died)" in final
    assert "last heal  cell 2 from cell 0: 12.0 MiB in 0.8s" in final
    assert "cell 2: failed" not in plain and mid is not None  # no plain lines in place
    assert "healing" in plain  # an intermediate frame showed the healing cell


def test_mode_follows_output() -> None:
    json_out = Output(Format.json)
    assert live_view(json_out, 4, 2)._live is None  # stderr of the test run is not a terminal either
    human = Output(Format.human)
    human.err = human.err.__class__(file=io.StringIO(), force_terminal=True)
    view = live_view(human, 4, 2)
    assert view._live is not None
    view.close()


def test_event_feed_and_step_only_feed() -> None:
    out = io.StringIO()
    view = LiveView(4, 2, live=False, stream=out)
    view.on_step(Report(0, 1, 0, 4, True, 0.5, 1.0, 0.25, 10.0, 1, 2))  # no cell-state feed yet
    assert view.states == {0: "alive", 1: "down"}
    view.on_event("cell_state", {"cell": 1, "old": "alive", "new": "errored", "reason": "rank died"})
    view.on_event("fault_injected", {"kind": "kill", "point": "backward", "cell": 1, "rank": 0, "step": 3})
    view.on_event("heal", {"cell": 1, "donor": 0, "bytes": 3 << 20, "seconds": {"transfer": 0.5, "verify": 0.25}})
    view.on_event("metric", {"values": {}})  # ignored
    view.on_step(Report(0, 1, 1, 4, True, 0.5, 1.0, 0.25, 10.0, 2, 2))
    assert view.states == {0: "alive", 1: "failed"}  # the feed, not the count, once there is one
    assert out.getvalue().splitlines()[1:4] == [
        "cell 1: errored (rank died)",
        "fault: kill at backward, cell 1 rank 0, step 3",
        "heal: cell 1 from cell 0: 3.0 MiB in 0.75s",
    ]


def test_faults_and_heals_logged_by_other_processes_reach_the_view(tmp_path) -> None:
    """The ranks and healers log faults and heals, the driver only cell states: with the run's
    events/ the view reads them from the log (issue 24 item 6); what a resumed run's earlier
    sessions logged is not news, a line still being written waits for its newline."""
    from ftkit.events.writer import EventWriter
    from ftkit.report.live_tail import EventTail

    events = tmp_path / "events"
    old = EventWriter(events, run="r", role="trainer", cell=1, rank=0, incarnation=0)
    old.emit("fault_injected", kind="kill", point="old", cell=1, rank=0, rollout=0, step=0)
    old.close()
    out = io.StringIO()
    with LiveView(4, 2, live=False, stream=out, tail=EventTail(events)) as view:
        view.on_cell_state(0, "alive")
        rank = EventWriter(events, run="r", role="trainer", cell=1, rank=0, incarnation=1)
        rank.emit("fault_injected", kind="kill", point="backward", cell=1, rank=0, rollout=0, step=3)
        view.on_cell_state(1, "failed", "rank died")
        assert view.fault == "kill at backward, cell 1 rank 0, step 3 -> cell 1 failed (rank died)"
        driver = EventWriter(events, run="r", role="driver", incarnation=0)
        driver.emit(
            "heal",
            cell=1,
            donor=0,
            epoch=2,
            bytes=3 << 20,
            seconds={"send": 0.5, "load": 0.25},
            total="ab",
            donor_total="ab",
        )
        with open(events / "partial.jsonl", "wb") as fh:
            fh.write(b'{"type": "heal", "cell": 9')  # no newline yet
        view.on_step(Report(0, 1, 3, 4, True, 0.4, 1.0, 0.5, 100.0, 2, 2))
        assert view.heal == "cell 1 from cell 0: 3.0 MiB in 0.75s"
        view.on_event("heal", {"cell": 7, "donor": 0, "bytes": 1, "seconds": {}})  # the driver's copy: not twice
    text = out.getvalue()
    assert "old" not in text and "cell 9" not in text and "cell 7" not in text
    assert text.count("fault: kill at backward") == 1 and text.count("heal: cell 1 from cell 0") == 1


def test_detected_failures_are_the_last_fault(tmp_path) -> None:
    """Issue 24 item 6: a cell that fails without an injection (a real crash) and an engine the
    driver replaces are faults of the view too, not only injected ones."""
    from ftkit.events.writer import EventWriter
    from ftkit.report.live_tail import EventTail

    events = tmp_path / "events"
    out = io.StringIO()
    with LiveView(4, 2, live=False, stream=out, tail=EventTail(events)) as view:
        view.on_cell_state(0, "alive")
        assert view.fault is None
        view.on_cell_state(1, "errored", "actor died")
        assert view.fault == "cell 1 errored (actor died)"
        driver = EventWriter(events, run="r", role="driver", incarnation=0)
        driver.emit("engine_failed", engine=0, incarnation=0, reason="actor died")
        view.on_step(Report(0, 1, 0, 4, True, 0.4, 1.0, 0.5, 100.0, 1, 2))
        assert view.fault == "engine 0 failed: actor died"
    assert "fault: engine 0 failed: actor died" in out.getvalue().splitlines()
