"""Where a run that lost every live cell starts again, inside the same ``ftkit train``.

When a fault (typically the loss of the one node holding every live cell) leaves no live
cell, no donor is left to heal from. With healing on, the driver (``Driver._recover``) stops
what is left of the cells, logs ``run_resumed`` (the analyzer's mark of a new session of the
same run: steps after its checkpoint are trained again and may be logged again) and starts
every cell again, on the live nodes, from ``recovery_plan``:

* the newest checkpoint of the run that verifies (``ftkit.train.recovery.resume_plan.plan_resume``: the
  checkpoint directory reconciled through its journal, newer checkpoints that do not verify
  skipped with a warning), restored into every cell: training goes on after its rollout;
* without one (none published yet, or none verifies), the seed's initial state that new cells hold anyway:
  training starts again at rollout 0.

Either way the steps are the same steps over the same data (rollouts depend only on the
seed and the weights), so the run still ends bitwise equal to the fault-free run. Epochs and
incarnations go on from the session that was lost, so no event file is reopened.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ftkit.train.recovery.resume_plan import ResumePlan, plan_resume

if TYPE_CHECKING:
    from ftkit.train.config import TrainConfig
    from ftkit.train.control.roster import CellRoster


def recovery_plan(run_dir: Path, cfg: TrainConfig, roster: CellRoster, warn: Callable[[str], None]) -> ResumePlan:
    """What the cells of ``run_dir`` start again from after ``roster`` (the session that lost
    every cell) is stopped; see the module docstring."""
    epoch = roster.book.epoch
    incarnation = max(cell.incarnation for cell in roster.cells.values()) + 1
    plan = plan_resume(run_dir, cfg, warn)
    return ResumePlan(plan.checkpoint, plan.skipped, max(epoch, plan.last_epoch), max(incarnation, plan.incarnation))
