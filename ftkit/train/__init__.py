"""The training core of ``ftkit train``, in sub-packages: ``config`` (the run config of
sections, what decides the result apart from how it is launched), ``control`` (the driver
side: the run loop, the step coordinator, healing, placement), ``rank`` (one megatron rank
as a Ray actor: compute, exact reduction, state), ``recovery`` (resume, restart from a
checkpoint, export of the final state), ``faults`` (injected faults), ``rl`` (rewards, engines, rollouts)."""
