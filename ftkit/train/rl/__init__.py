"""The RL loop's parts outside the ranks (the tasks and rewards themselves are ``ftkit.tasks``):
``rewards`` how a rollout is scored by the reward ``--reward`` names, ``engines`` the inference
engine actor (weights loaded and fingerprinted, seeded sampling), ``rollouts`` the recorded
global batch of a rollout, ``microshards`` how a step's batch is cut and assigned to the live
cells (its RNG streams derived from (seed, rollout, step, micro-shard) by
``ftkit.tensors.seeds``, never from a cell)."""
