"""How failures were detected (invariant I5's cost side): FT115 a cell likely failed by mistake.

A survivor waiting inside a collective on a peer that died looks, from the driver, like a cell
that does not answer. A driver that declares it ``hung`` at the same deadline at which it
declares the dead peer kills a healthy cell, and under load can lose every cell at once (issue
25, item 3). ftkit's own driver reports such a cell as blocked and keeps it; a log of another
producer or an older ftkit may still hold the pattern: a ``cell_state`` -> failed / errored
whose reason is ``hung: no answer after X s`` while another cell's failure for another reason
(dead, an exception, ...) was declared within those ``X`` seconds before it. That is a warning:
the run may well be correct, but a healthy cell was probably killed and restarted.

Memory: the failure declarations of the last ``MAX_WINDOW_S`` seconds.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any

from ftkit.analysis.registry import Rule, register
from ftkit.events.envelope import DEAD_STATES
from ftkit.findings import Severity

_HUNG = re.compile(r"hung: no answer after ([0-9]+(?:\.[0-9]+)?)s")
#: Declarations older than this are forgotten (no deadline of a real run is longer).
MAX_WINDOW_S = 3600.0


@register
class FalseFailure(Rule):
    code = "FT115"
    name = "false-failure"
    severity = Severity.warning
    description = (
        "a cell declared hung at a deadline within which another cell's death or error had been declared: "
        "a survivor blocked on a dead peer was most likely failed by mistake"
    )
    fix = (
        "a survivor blocked on a dead peer is not hung: the driver should treat it as a collective symptom; "
        "with ftkit's driver, report it as a bug"
    )
    events = ("cell_state",)

    def __init__(self, replay: Any) -> None:
        super().__init__(replay)
        self._recent: deque[tuple[float, int, str]] = deque()  # (time, cell, reason) of non-hung failures

    def on_event(self, ev: dict[str, Any], fi: int, line: int) -> None:
        if ev["new"] not in DEAD_STATES:
            return
        t, cell, reason = float(ev["time"]), ev["cell"], str(ev.get("reason") or "")
        recent = self._recent
        while recent and recent[0][0] < t - MAX_WINDOW_S:
            recent.popleft()
        hung = _HUNG.search(reason)
        if hung is None:
            recent.append((t, cell, reason))
            return
        self.check()  # one hang declaration weighed against the failures before it
        window = float(hung.group(1))
        peers = [(pt, pc, pr) for pt, pc, pr in recent if pc != cell and t - window <= pt <= t]
        if peers:
            pt, pc, pr = peers[-1]
            self.report(
                f"cell {cell} was declared hung ({reason[:80]}) {t - pt:.1f}s after cell {pc} failed ({pr[:80]}): "
                "it was most likely blocked on its dead peer, not hung",
                cell=cell,
                peer=pc,
                where=self.replay.where(fi, line),
            )

    def finish(self) -> None:
        self.check()  # the log's failure declarations were all examined (a run without a hang passes)
