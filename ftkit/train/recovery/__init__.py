"""Continuing a run from what it left: ``resume_plan`` is ``--resume``'s config (what a
resumed session may change, derived from the config's places) and the plan it starts from
(the newest checkpoint that verifies, epoch, incarnation, a layout change); ``resume`` loads a
checkpoint into the cells; ``all_lost`` restarts every cell of a run that lost them all;
``checkpoint_replay`` re-runs one rollout from a checkpoint (``ftkit dump --from-checkpoint``);
``export`` writes a run's final state as a Hugging Face directory (``ftkit export``)."""
