"""Log integrity and run completion (invariants I5, I6): FT111 log integrity, FT113 unrecovered faults.

Most FT111 findings come from the reader and the replay (malformed / truncated / too long lines,
seq gaps, invalid events, several runs); this rule adds what is only known at the end.
"""

from __future__ import annotations

from typing import Any

from ftkit.analysis.registry import Rule, register
from ftkit.findings import Severity


@register
class LogIntegrity(Rule):
    code = "FT111"
    name = "log-integrity"
    description = (
        "seq gap, malformed or truncated line (truncated last line: a warning), invalid event, "
        "no run_started, events after run_finished, writer-reported drops"
    )
    fix = "lines were lost or the log was damaged: check disk space and that every process closes its writer"
    events = ("events_dropped",)

    def on_event(self, ev: dict[str, Any], fi: int, line: int) -> None:
        self.report(
            f"a writer dropped {ev['count']} line(s): {ev['last_error']}",
            count=ev["count"],
            where=self.replay.where(fi, line),
        )

    def finish(self) -> None:
        r = self.replay
        self.check(r.events)
        if r.run_started is None:
            self.report("no run_started event: the log is incomplete or not a run log")
        if r.after_finish[0]:
            self.report(
                f"{r.after_finish[0]} event(s) logged after run_finished",
                count=r.after_finish[0],
                where=r.after_finish[1],
            )
        if r.late[0]:
            self.report(
                f"{r.late[0]} event(s) arrived after their step or rollout was closed (out of time order)",
                Severity.warning,
                count=r.late[0],
                where=r.late[1],
            )


@register
class FaultUnrecovered(Rule):
    code = "FT113"
    name = "fault-unrecovered"
    description = (
        "a fault (injected, or a cell or engine failure the driver detected) with no following reconfigure, heal "
        "or committed retry, or a run that did not complete"
    )
    fix = "the run did not recover from a fault: see the recovery table and the driver's log"

    def finish(self) -> None:
        r = self.replay
        for row in r.recovery.rows:
            self.check()
            if row.recovered_by is None:
                who = f"cell {row.cell}" if row.engine is None else f"engine {row.engine}"
                at = ", ".join([who] + ([f"step {row.step}"] if row.step is not None else []))
                what = f"fault {row.kind} at {row.point} ({at})" if row.injected else f"failure of {who} ({row.cause})"
                self.report(
                    f"{what} was not followed by a reconfigure, heal or committed retry",
                    cell=row.cell,
                    rank=row.rank,
                    step=row.step,
                    rollout=row.rollout,
                    where=row.where,
                )
        self.check()
        if r.run_finished is None:
            self.report("the run did not finish: no run_finished event")
        elif r.run_finished[0]["status"] != "completed":
            ev = r.run_finished[0]
            self.report(
                f"the run ended {ev['status']}: {ev.get('reason') or 'no reason given'}",
                status=ev["status"],
                where=r.run_finished[1],
            )
