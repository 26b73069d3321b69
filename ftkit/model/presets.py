"""Model presets: the flavours of ftkit's own GPT family (``FAMILY``), the megatron-core models
``ftkit train`` builds from a seed rather than from a checkpoint.

A flavour is a ``ModelPreset``: the shapes of one model, under the same field names and with the
same layout checks as a Hugging Face architecture (``ftkit.model.hf_config.HFArch``:
``num_layers``, ``hidden_size``, ``num_heads``, ``num_kv_heads``, ``ffn_hidden_size``,
``vocab_size``, ``padded_vocab``, ``max_seq_len``, ``tied``, ``dtype``, ``check_layout``), so what
reads a model's shapes (``ftkit.model.spec.ModelSpec.arch``) reads either alike. The network
itself is not a Llama (LayerNorm, GELU, biases, learned absolute positions: ``ftkit.model.gpt``);
mapping the presets onto the Llama family would change every weight they draw.

Every preset has the same 64-token vocabulary (the synthetic task's tokens fit inside it):
64 is divisible by every TP size we support (1, 2, 4, 8), so no TP size pads the vocabulary
differently and a TP=2 export has exactly the TP=1 layout. Dropout is off in every preset,
so a micro-shard's forward and backward consume no random numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

VOCAB_SIZE = 64
#: The family name of the presets (``ftkit.model.spec.ModelSpec.family``).
FAMILY = "gpt"


@dataclass(frozen=True)
class ModelPreset:
    """Shapes of one GPT model (decoder only, learned absolute positions, untied output,
    float32, no vocabulary padding)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    ffn_hidden_size: int
    max_seq_len: int
    vocab_size: int = VOCAB_SIZE
    tied: bool = False
    dtype: str = "float32"

    @property
    def num_kv_heads(self) -> int:
        """Key/value heads: one per query head (no grouped-query attention)."""
        return self.num_heads

    @property
    def padded_vocab(self) -> int:
        """The vocabulary megatron holds: the preset's own (it splits over every TP size)."""
        return self.vocab_size

    def check_layout(self, tp: int, pp: int) -> None:
        """``ValueError`` (naming the layout field) unless the shapes split over ``tp`` x ``pp``
        ranks: heads and vocabulary over TP, the layers evenly over the PP stages."""
        if self.num_heads % tp:
            raise ValueError(f"tp ({tp}) must divide the {self.name} model's heads ({self.num_heads})")
        if self.vocab_size % tp:
            raise ValueError(f"tp ({tp}) must divide the vocabulary ({self.vocab_size})")
        if self.num_layers % pp:
            raise ValueError(
                f"pp ({pp}) must divide the {self.name} model's {self.num_layers} layers "
                "(each pipeline stage holds the same number)"
            )

    @property
    def approx_params(self) -> int:
        """Parameter count (without the witness table), for docs and sanity checks."""
        h, f, v, s = self.hidden_size, self.ffn_hidden_size, self.vocab_size, self.max_seq_len
        per_layer = (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h) + 4 * h
        return self.num_layers * per_layer + v * h + s * h + 2 * h + v * h


PRESETS: dict[str, ModelPreset] = {
    # Trains a rollout in seconds on two CPU cores.
    "tiny": ModelPreset("tiny", num_layers=2, hidden_size=64, num_heads=4, ffn_hidden_size=256, max_seq_len=32),
    # About 25M parameters: 8 layers of hidden 512.
    "small": ModelPreset("small", num_layers=8, hidden_size=512, num_heads=8, ffn_hidden_size=2048, max_seq_len=64),
}


def get_preset(name: str) -> ModelPreset:
    """The preset called ``name``; ``KeyError`` lists the known names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}") from None
