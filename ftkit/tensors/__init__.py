"""Tensor fingerprints, safetensors helpers (atomic writes, validated headers), TP sharding
metadata and the stable seeds of a run's random streams (``seeds``). See docs/fingerprints.md."""
