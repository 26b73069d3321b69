"""The rank side: one megatron rank of one cell, a Ray actor. ``worker`` is the actor's face
(``RankWorker``) over its ``context`` (``RankContext``: what every collaborator is handed) and
``compute`` (``StepCompute``: phase 1 of a step); ``step_types`` the typed values that cross the
driver <-> rank seam; ``reducer`` the exact int64 fixed-point reduction and ``crosscell`` the
cross-cell group it runs over; ``pipeline`` / ``loss`` the forward and backward of a
micro-shard; ``witness`` the per-sample witness; ``state`` / ``state_codec`` /
``canonical_state`` a rank's complete state and its TP=1/PP=1 form; ``heal`` / ``heal_stream``
receiving a donor's state; ``checkpoints`` and ``dumps`` what a rank publishes and dumps;
``shard_cache`` a discarded attempt's rows."""
