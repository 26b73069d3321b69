"""The prompts ``ftkit check-model`` runs, encoded: the built-in set or the user's, checked first.

``encode_prompts(tokenizer, arch, prompts, window)`` returns ``(label, ids [1, T])`` per prompt
and the warnings to show. ``prompts=None`` is the built-in set (``PROMPTS``), plus, for a model
with Llama-3 RoPE scaling, one prompt longer than the original context
(``ORIGINAL_CONTEXT`` + ``LONG_PAST`` tokens, at most the model's length): short prompts use only
positions where scaled and unscaled RoPE nearly agree, so a dropped scaling factor passes them.

A prompt that encodes to no token cannot be run: the user's is an ``InputError`` (exit 2) naming
it; a built-in one is skipped with a warning (a tokenizer that maps it to nothing). A prompt
longer than the model's length is an ``InputError`` too, and when the model's sliding window is
what limits that length (Mistral: ftkit's attention is fully causal, the same as sliding-window
attention only up to the window), the message says so instead of computing a divergence that
is the window's, not a bug's.
"""

from __future__ import annotations

from typing import Any

from ftkit.errors import InputError

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "3 + 4 =",
    "Once upon a time, there was a little",
)
#: Megatron's Llama-3 RoPE scaling has original_max_position_embeddings fixed at this.
ORIGINAL_CONTEXT = 8192
#: Tokens the long prompt goes past the original context.
LONG_PAST = 64
_FILLER = "The quick brown fox jumps over the lazy dog while the clock on the old tower strikes twelve. "


def encode_prompts(
    tokenizer: Any, arch: Any, prompts: list[str] | None, window: int | None
) -> tuple[list[tuple[str, Any]], list[str]]:
    """``([(label, ids)], warnings)``: see the module docstring. ``window``: the config's
    ``sliding_window`` (``None``: none)."""
    import torch

    builtin = prompts is None
    out: list[tuple[str, Any]] = []
    warnings: list[str] = []
    for prompt in PROMPTS if prompts is None else prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        if ids.shape[1] == 0:
            if not builtin:
                raise InputError(
                    f"--prompt {prompt!r} encodes to no token with this model's tokenizer",
                    "give a prompt with some text in it, e.g. --prompt 'The capital of France is'",
                )
            warnings.append(f"built-in prompt {prompt!r} encodes to no token with this tokenizer: skipped")
            continue
        _check_length(prompt, int(ids.shape[1]), arch.max_seq_len, window)
        out.append((prompt, ids))
    if builtin and arch.rope_scaling_factor is not None:
        n = min(ORIGINAL_CONTEXT + LONG_PAST, arch.max_seq_len)
        text = _FILLER
        while len(tokenizer(text).input_ids) < n:
            text += text
        ids = torch.tensor([tokenizer(text).input_ids[:n]])
        out.append((f"long prompt ({n} tokens, past the original context of {ORIGINAL_CONTEXT})", ids))
        if n <= ORIGINAL_CONTEXT:
            warnings.append(
                f"the model's length {arch.max_seq_len} does not reach past RoPE scaling's original context "
                f"{ORIGINAL_CONTEXT}: the long prompt has {n} tokens"
            )
    return out, warnings


def _check_length(prompt: str, tokens: int, limit: int, window: int | None) -> None:
    if tokens <= limit:
        return
    if window is not None and window == limit:
        raise InputError(
            f"prompt {prompt!r} has {tokens} tokens, longer than the model's sliding window of {window}: ftkit's "
            "attention is fully causal, the same as sliding-window attention only up to the window, so the "
            "two models are not comparable on it (not a divergence)",
            f"give prompts of at most {window} tokens",
        )
    raise InputError(
        f"prompt {prompt!r} has {tokens} tokens, more than the model's length of {limit}",
        f"give prompts of at most {limit} tokens",
    )
