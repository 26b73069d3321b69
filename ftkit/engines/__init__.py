"""Inference engines behind one protocol (``protocol.Engine``): load weights in place, prove
what is held (a fingerprint of what the engine computes with, in the names sent), generate with
per-token log-probs. ``megatron.MegatronEngine`` is ftkit's own (a TP=1 megatron-core model,
bitwise the trainer's log-probs); ``vllm.VllmEngine`` runs vLLM in its own virtualenv
(``vllm_server``); ``policy`` holds what the megatron engine and the trainer share."""
