"""What a synthetic run looks like (``SyntheticSpec``), what ``generate`` reports back
(``GeneratedRun``), the rules it can violate on purpose (``VIOLATIONS``) and the parameter names
its state fingerprints cover (``tensor_names``). The generator itself is
``ftkit.testing.synthetic``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

VIOLATIONS = (
    "FT101",
    "FT102",
    "FT103",
    "FT104",
    "FT105",
    "FT106",
    "FT107",
    "FT108",
    "FT109",
    "FT110",
    "FT111",
    "FT112",
    "FT113",
    "FT114",
)
_LAYER_TENSORS = (
    "input_layernorm.weight",
    "self_attention.linear_qkv.weight",
    "self_attention.linear_qkv.bias",
    "self_attention.linear_proj.weight",
    "pre_mlp_layernorm.weight",
    "mlp.linear_fc1.weight",
    "mlp.linear_fc2.weight",
    "mlp.linear_fc1.bias",
)


@dataclass
class SyntheticSpec:
    """The simulated layout (``cells x tp x pp`` ranks, ``engines``), its length (``rollouts`` of
    ``steps_per_rollout`` steps over ``samples_per_rollout`` samples), its ``faults`` (each cell
    healed ``heal_after`` steps later), and the one rule to violate (``violation``, or None)."""

    cells: int = 4
    tp: int = 1
    pp: int = 1
    engines: int = 2
    rollouts: int = 3
    steps_per_rollout: int = 4
    samples_per_rollout: int = 32
    micro_shards: int = 8
    tensors: int = 100
    faults: int = 1
    heal_after: int = 1
    checkpoint_every: int = 4
    seed: int = 0
    run: str = "synthetic"
    loss: str = "reinforce"  # grpo: ranks log logprob_check at each rollout's first step (FT114)
    violation: str | None = None

    @property
    def steps(self) -> int:
        return self.rollouts * self.steps_per_rollout


@dataclass
class GeneratedRun:
    """The written run: its ``events_dir``, how many events, the steps a fault struck and the
    step the violation was injected at (None without one)."""

    events_dir: Path
    events: int
    fault_steps: list[int] = field(default_factory=list)
    violation_step: int | None = None


def tensor_names(n: int) -> list[str]:
    """``n`` Megatron-style parameter names (embedding, layers, final norm, output layer)."""
    names = ["embedding.word_embeddings.weight"]
    layer = 0
    while len(names) < n - 2:
        names += [f"decoder.layers.{layer}.{t}" for t in _LAYER_TENSORS][: n - 2 - len(names)]
        layer += 1
    return (names + ["decoder.final_layernorm.weight", "output_layer.weight"])[:n]
