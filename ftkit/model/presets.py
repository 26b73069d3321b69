"""Model presets: the shapes of the megatron-core GPT models ``ftkit train`` builds.

Every preset has the same 64-token vocabulary (the synthetic task's tokens fit inside it):
64 is divisible by every TP size we support (1, 2, 4, 8), so no TP size pads the vocabulary
differently and a TP=2 export has exactly the TP=1 layout. Dropout is off in every preset,
so a micro-shard's forward and backward consume no random numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

VOCAB_SIZE = 64


@dataclass(frozen=True)
class ModelPreset:
    """Shapes of one GPT model (decoder only, learned absolute positions, untied output)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    ffn_hidden_size: int
    max_seq_len: int
    vocab_size: int = VOCAB_SIZE

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
