"""The faults of a run: its ``--inject`` specs, then the ``--chaos`` expansion.

``parse_specs(inject, chaos, bounds)`` is what ``ftkit.train.plan.run_plan.build_plan`` parses and
``ftkit.train.plan.run_plan.RunPlan.faults`` holds; deterministic in the chaos seed.
"""

from __future__ import annotations

from collections.abc import Sequence

from ftkit.train.faults.chaos import expand_chaos
from ftkit.train.faults.spec import FaultBounds, FaultSpec, parse_spec


def parse_specs(inject: Sequence[str], chaos: str | None, bounds: FaultBounds | None = None) -> list[FaultSpec]:
    """Every ``--inject`` spec, then the ``--chaos`` expansion (deterministic in its seed)."""
    specs = [parse_spec(s, bounds) for s in inject]
    if chaos is not None:
        specs += expand_chaos(chaos, bounds)
    return specs
