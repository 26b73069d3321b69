"""The live view of ``ftkit train`` on stderr.

``LiveView`` is fed by the driver's callbacks: ``on_step(StepReport)`` after every optimizer
step, and, where the driver offers them, ``on_cell_state(cell, state, reason)``,
``on_fault(text)`` and ``on_heal(text)`` -- or all three at once through
``on_event(event_type, fields)`` with what the driver logs. Faults and heals are logged by the
ranks and healers, not the driver: given the run's ``events/`` (``live_view(..., events_dir)``)
the view reads them from the log at every callback (``ftkit.report.live_tail``). "Last fault"
is the last injected fault, engine failure (``engine_failed``) or detected cell failure (a
cell going to ``failed`` / ``errored``, injected or not); the first cell failure after an
injected fault reads ``<injection> -> cell N failed (reason)``. Without a cell-state feed the cells
shown are the step's alive count. It shows, in place, when stderr is a terminal
(``live=True``): a progress bar over the run's steps with the rollout, the cells' states at a
glance (one coloured block per cell: alive, failed, restarting, healing, stopped ...), the
last fault and the last heal, and the latest reward, loss, grad norm and tokens/s, then the RL
metrics of the step and its rollout (``rl_text``: reward spread, groups without signal, response
lengths, entropy, KL, clip fraction, engine-vs-trainer log-prob difference, generation
tokens/s; docs/rl.md "Metrics"). Otherwise
(``live=False``: stderr redirected, CI logs, ``--format json``) it writes plain lines, one per
step and one per cell-state change, fault or heal, exactly what a log file wants.

``live_view(output)`` picks the mode from the command's ``Output`` (live only in human mode
on an interactive stderr). Use it as a context manager, so the terminal is restored even
when training raises::

    with live_view(output, total_steps=S, cells=C) as view:
        run_training(cfg, on_step=view.on_step)

The view never raises into training: a rendering error turns it into plain lines.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, TextIO

from rich.console import Console, Group
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from ftkit.report.escaping import literal
from ftkit.report.live_tail import EventTail

_SHOWN = {"errored": "failed"}  # event-log state -> shown state
STATE_STYLE = {
    "alive": "green",
    "failed": "red",
    "down": "red",
    "restarting": "yellow",
    "starting": "cyan",
    "healing": "magenta",
    "pending": "bright_black",
    "stopped": "bright_black",
}


class StepLike(Protocol):
    """What ``LiveView.on_step`` reads (``ftkit.train.control.driver.StepReport`` has these fields)."""

    rollout: int
    rollouts: int
    step: int
    steps: int
    attempts: int
    loss: float
    grad_norm: float
    reward: float
    tokens_per_s: float
    cells_alive: int
    cells: int

    @property
    def metrics(self) -> Mapping[str, float]: ...

    @property
    def committed(self) -> bool: ...


#: The RL metrics ``rl_text`` shows, in order: (metric, label, format); absent ones are skipped.
_RL_SHOWN = (
    ("reward_std", "reward std", "{:.3f}"),
    ("zero_advantage_groups", "zero-adv groups", "{:.0%}"),
    ("response_length_mean", "len", "{:.1f}"),
    ("response_length_max", "max", "{:.0f}"),
    ("truncated_fraction", "cut", "{:.0%}"),
    ("entropy", "entropy", "{:.4g}"),
    ("kl", "kl", "{:.4g}"),
    ("clip_fraction", "clip", "{:.1%}"),
    ("logprob_diff_max_abs", "lp-diff max", "{:.3g}"),
    ("gen_tokens_per_s", "gen", "{:,.0f} tok/s"),
)


def rl_text(metrics: Mapping[str, float]) -> str:
    """The RL metrics of a step's report as one line (empty without any): ``reward std 0.120
    zero-adv groups 25%  len 6.5  max 8  cut 10%  entropy 1.23  clip 3.1%  gen 4,321 tok/s``."""
    parts = []
    for name, label, fmt in _RL_SHOWN:
        value = metrics.get(name)
        if value is not None:
            parts.append(f"{label} {fmt.format(value)}")
    return "  ".join(parts)


def step_text(r: StepLike) -> str:
    """One plain line per step: ``rollout 1/3  step 2/6  loss ...  cells 2/2  1,234 tok/s``, plus
    ``  N attempts`` when faults made the step retry, then `` | `` and the RL metrics (``rl_text``)."""
    state = ("" if r.committed else "  DISCARDED") + (f"  {r.attempts} attempts" if r.attempts > 1 else "")
    rl = rl_text(r.metrics)
    return (
        f"rollout {r.rollout + 1}/{r.rollouts}  step {r.step + 1}/{r.steps}  loss {r.loss:+.5f}  "
        f"reward {r.reward:.3f}  grad_norm {r.grad_norm:.4g}  cells {r.cells_alive}/{r.cells}  "
        f"{r.tokens_per_s:,.0f} tok/s{state}" + (f"  | {rl}" if rl else "")
    )


class LiveView:
    """See the module docstring. ``stream`` defaults to ``sys.stderr``."""

    def __init__(
        self, total_steps: int, cells: int, live: bool, stream: TextIO | None = None, tail: EventTail | None = None
    ) -> None:
        self.tail = tail
        self.total = max(total_steps, 1)
        self.states: dict[int, str] = {c: "pending" for c in range(cells)}
        self.state_fed = False
        self.last: StepLike | None = None
        self.done = 0
        self.discarded = 0
        self.fault: str | None = None
        self.heal: str | None = None
        self._undetected = False  # the last fault is one whose failure has not been seen yet
        self.stream = stream if stream is not None else sys.stderr
        self.console = Console(file=self.stream, highlight=False, emoji=False, force_terminal=True if live else None)
        self._live: Any = None
        if live:
            from rich.live import Live

            self._live = Live(
                self._render(), console=self.console, auto_refresh=False, transient=False, redirect_stdout=False
            )

    # ------------------------------------------------------------------ feed
    def on_step(self, report: StepLike) -> None:
        self._drain()
        self.last, self.done = report, report.step + 1
        self.total = max(report.steps, 1)
        self.discarded += not report.committed
        if not self.state_fed:  # no cell-state feed: the step's alive count is all there is
            self.states = {c: "alive" if c < report.cells_alive else "down" for c in range(report.cells)}
        self._show(step_text(report))

    def on_cell_state(self, cell: int, state: str, reason: str | None = None) -> None:
        self._drain()
        self.state_fed = True
        self.states[cell] = _SHOWN.get(state, state)
        change = f"cell {cell}: {state}" + (f" ({reason})" if reason else "")
        if self.states[cell] == "failed":  # a detected failure is a fault too, injected or not
            detected = f"cell {cell} {state}" + (f" ({reason})" if reason else "")
            self.fault = f"{self.fault} -> {detected}" if self._undetected else detected
            self._undetected = False
        self._show(change)

    def on_event(self, event_type: str, fields: dict[str, Any]) -> None:
        """Feed from the driver's event stream (the type and fields it logs): ``cell_state``,
        ``fault_injected`` and ``heal`` update the view, other types are ignored. With a ``tail``
        the faults and heals come from the run's log instead (every process's, not only the
        driver's), so the driver's own copies are not shown twice."""
        if event_type == "cell_state":
            self.on_cell_state(int(fields["cell"]), str(fields["new"]), fields.get("reason"))
            return
        self._drain()
        if self.tail is None:
            self._logged(event_type, fields)

    def _drain(self) -> None:
        """Show the faults and heals the tail found since the last callback (never raises)."""
        if self.tail is None:
            return
        try:
            events = self.tail.poll()
        except Exception:  # noqa: BLE001 - the view never raises into training
            return
        for ev in events:
            with contextlib.suppress(TypeError, ValueError, AttributeError):  # a damaged line: skipped
                self._logged(str(ev.get("type")), ev)

    def _logged(self, event_type: str, fields: dict[str, Any]) -> None:
        """A fault or a heal as the log holds it."""
        if event_type == "fault_injected":
            self.on_fault(
                f"{fields.get('kind')} at {fields.get('point')}, cell {fields.get('cell')} rank {fields.get('rank')}, "
                f"step {fields.get('step')}"
            )
        elif event_type == "engine_failed":
            self.on_fault(f"engine {fields.get('engine')} failed: {fields.get('reason')}")
            self._undetected = False  # an engine failure is its own detection
        elif event_type == "heal":
            took = sum(float(v) for v in dict(fields.get("seconds") or {}).values())
            self.on_heal(
                f"cell {fields.get('cell')} from cell {fields.get('donor')}: "
                f"{int(fields.get('bytes') or 0) / 2**20:.1f} MiB in {took:.3g}s"
            )

    def on_fault(self, text: str) -> None:
        self.fault, self._undetected = text, True
        self._show(f"fault: {text}")

    def on_heal(self, text: str) -> None:
        self.heal = text
        self._show(f"heal: {text}")

    # ------------------------------------------------------------------ output
    def _show(self, line: str) -> None:
        """Show ``line`` (plain mode) or the new frame; progress lost to a stderr that went away
        (a hung-up terminal, a closed pipe) never stops training."""
        if self._live is None:
            with contextlib.suppress(OSError, ValueError):
                self.stream.write(line + "\n")
                self.stream.flush()
            return
        try:
            self._live.update(self._render(), refresh=True)
        except Exception:  # noqa: BLE001 - a broken terminal must not stop training
            self.close()
            with contextlib.suppress(OSError, ValueError):
                self.stream.write(line + "\n")

    def _render(self) -> Group:
        bar = ProgressBar(total=self.total, completed=self.done, width=40)
        r = self.last
        where = f"rollout {r.rollout + 1}/{r.rollouts}  " if r is not None else ""
        head = Table.grid(padding=(0, 1))
        head.add_row(Text("ftkit train", style="bold"), bar, Text(f"{where}step {self.done}/{self.total}"))
        cells = Text("cells ")
        for _, state in sorted(self.states.items()):
            cells.append("\u25a0", style=STATE_STYLE.get(state, "white"))
        alive = sum(s == "alive" for s in self.states.values())
        cells.append(f"  {alive}/{len(self.states)} alive  ")
        cells.append("  ".join(f"{c}:{s}" for c, s in sorted(self.states.items()) if s != "alive"), style="dim")
        lines: list[Any] = [head, cells]
        if r is not None:
            lines.append(
                Text.from_markup(
                    f"reward [bold]{r.reward:.3f}[/bold]  loss [bold]{r.loss:+.5f}[/bold]  grad_norm {r.grad_norm:.4g}"
                    f"  {r.tokens_per_s:,.0f} tok/s  discarded attempts {self.discarded}"
                )
            )
            rl = rl_text(r.metrics)
            if rl:
                lines.append(Text(rl, style="dim"))
        lines.append(Text.from_markup(f"[red]last fault[/red] {literal(self.fault or '-')}"))
        lines.append(Text.from_markup(f"[magenta]last heal[/magenta]  {literal(self.heal or '-')}"))
        return Group(*lines)

    def close(self) -> None:
        """Leave the last frame on screen and give the terminal back (idempotent)."""
        live, self._live = self._live, None
        if live is not None and live.is_started:
            with contextlib.suppress(OSError, ValueError):  # the terminal may be gone (SIGHUP)
                live.stop()

    def __enter__(self) -> LiveView:
        if self._live is not None:
            self._live.start(refresh=True)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def live_view(output: Any, total_steps: int, cells: int, events_dir: Path | None = None) -> LiveView:
    """The view for a command's ``Output``: live in human mode on an interactive stderr, plain
    lines otherwise; with ``events_dir`` (the run's ``events/``) it shows the faults and heals
    every process logs there (``EventTail``)."""
    live = bool(output.human and output.err.is_terminal)
    tail = EventTail(events_dir) if events_dir is not None else None
    return LiveView(total_steps, cells, live, stream=output.err.file, tail=tail)
