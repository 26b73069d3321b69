"""The replay's view of a resumed run: ``run_resumed`` starts a later session of the same run.

``ftkit train --resume`` continues a run in its directory: a new driver incarnation logs
``run_resumed`` (in place of ``run_started``) and new trainer and engine incarnations log the
rest. What the combined log of all sessions means to the replay (``on_run_resumed``):

- the run goes on: an earlier ``run_finished`` is no longer its end, and the resumed session's
  layout (cells, engines, tp, pp) is the run's from here on (``run_started`` is replaced; the
  cells' states start again from ``pending``);
- the earlier sessions are over: a stream that began before the resume and ended without
  ``log_closed`` belongs to a session killed as a whole (its driver too), not to a cut log
  (``Closure.resumed``);
- steps up to ``checkpoint_step`` were committed earlier and their state is the checkpoint's;
  steps after it that an earlier session began are superseded: their open records and open
  rollouts are dropped and the steps may be logged again (``closed_below`` and the driver's last
  declared step go back); how many committed steps are trained again is kept per restart
  (``replay.restarts``: the report shows them, so a run killed once does not read as more steps).

A ``run_resumed`` with no ``run_started`` before it means the earlier sessions' logs are
missing (FT111).
"""

from __future__ import annotations

from typing import Any


def on_run_resumed(replay: Any, ev: dict[str, Any], fi: int, line: int) -> None:
    """Apply a ``run_resumed`` event to ``replay`` (an ``ftkit.analysis.replay.Replay``)."""
    if replay.run_started is None:
        replay.report(
            "FT111",
            "run_resumed, but no run_started before it: the earlier sessions' log is missing",
            where=replay.where(fi, line),
        )
    replay.run_started = ev
    replay.run_finished = None
    replay.cell_status = {}  # the new session's cells start from pending
    replay.closure.resumed(ev["time"])
    step, rollout = ev["checkpoint_step"], ev["checkpoint_rollout"]
    # the steps an earlier session committed after the checkpoint are trained (and counted) again
    replay.restarts.append({"checkpoint_step": step, "retrained": max(0, replay.last_committed - step)})
    replay.last_committed = min(replay.last_committed, step)
    for key in [k for k in replay.pending if k[1] > step]:
        del replay.pending[key]
    for r in [r for r in replay.rollouts if r > rollout]:
        del replay.rollouts[r]
    replay.closed_below = min(replay.closed_below, step + 1)
    replay.declared_step = min(replay.declared_step, step)  # the steps after it are trained again
