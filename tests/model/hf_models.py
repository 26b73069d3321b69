"""Small random-init Hugging Face models of every family, made with ``transformers`` (no download).

``make_model(family, tmp_path, **overrides)`` saves one to ``tmp_path / family`` and returns the
directory: head_dim 32, 4 query heads over 2 KV heads, 2 layers, a vocabulary of 300 (padded to
1024 rows, so the padding path runs), norms and biases drawn away from their init values so
a swapped or missing one changes the output. ``dtype="bfloat16"`` saves it as transformers
saves a bf16 model (``model.to(torch.bfloat16).save_pretrained``: bf16 tensors, the config's
dtype ``bfloat16``), what published checkpoints are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
}


def make_model(
    family: str, root: Path, seed: int = 0, *, eos: bool = False, dtype: str = "float32", **overrides: Any
) -> Path:
    import torch
    import transformers

    config_cls, model_cls = FAMILIES[family]
    kw: dict[str, Any] = dict(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=300,
        max_position_embeddings=256,
        architectures=[model_cls],
        tie_word_embeddings=family == "llama",
    )
    kw.update(overrides)
    config = getattr(transformers, config_cls)(**kw)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.1)
            elif "bias" in name:
                p.normal_(0.0, 0.1)
    out = root / family
    model.to(getattr(torch, dtype)).save_pretrained(out)
    save_tokenizer(out, kw["vocab_size"], eos=eos)
    return out


TEXT = [
    "The capital of France is Paris. The capital of Italy is Rome.",
    "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "3 + 4 = 7, 12 + 5 = 17. Once upon a time, there was a little model.",
]


def save_tokenizer(out: Path, vocab_size: int, eos: bool = False) -> None:
    """A byte-level BPE tokenizer of ``vocab_size`` tokens trained on ``TEXT`` (offline); with
    ``eos`` its first token is ``<|endoftext|>``, the tokenizer's bos and eos token (what the
    built-in training task needs)."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    special = ["<|endoftext|>"] if eos else []
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(TEXT, vocab_size=vocab_size, min_frequency=1, show_progress=False, special_tokens=special)
    kw = {"bos_token": special[0], "eos_token": special[0]} if eos else {}
    PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, **kw).save_pretrained(out)
