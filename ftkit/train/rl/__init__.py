"""The RL loop's parts outside the ranks: ``task`` the built-in verifiable addition task,
``rewards`` the reward functions, ``engines`` the inference engine actor (weights loaded and
fingerprinted, seeded sampling), ``rollouts`` the recorded global batch of a rollout,
``microshards`` how a step's batch is cut and assigned to the live cells, ``seeds`` the RNG
streams derived from (seed, rollout, step, micro-shard), never from a cell."""
