"""Per-rollout safetensors dumps: capture hooks, writer, layout and index, loader, comparator.
See docs/dumps.md."""
