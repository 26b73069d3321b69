"""The driver side of ``ftkit train``: the ``ftkit train`` process that owns the run. ``driver``
runs the rollout loop over the cells; ``coordinator`` commits or discards each step on every
live cell (two-phase, with retries); ``roster`` is the session's cells as every collaborator
sees them (wait under deadlines with ``waiting``, fail, restart queue); ``healing`` restarts
and heals failed cells; ``cells`` / ``cell_state`` are a cell's Ray actors and its state
machine; ``placement`` spreads cells and engines over a cluster's nodes; ``engine_pool`` keeps
the inference engines; ``checkpoints`` publishes guarded checkpoints; ``ray_session`` /
``ray_probe`` connect to Ray; ``rundir`` and ``run_end`` are the run directory and how a run
ends (exit codes, status.json, signals)."""
