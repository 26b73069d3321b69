"""Tensor fingerprints, safetensors helpers (atomic writes, validated headers) and TP sharding
metadata. See docs/fingerprints.md."""
