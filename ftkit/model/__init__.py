"""megatron-core GPT model construction, layer specs and presets (heavy imports inside functions)."""
