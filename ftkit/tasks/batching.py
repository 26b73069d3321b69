"""Prompts and responses as padded token arrays whose shapes the config alone fixes.

``render_prompt`` applies the tokenizer's chat template where it has one (one user message,
``add_generation_prompt=True``, text out, then encoded without adding special tokens again: the
template holds them) and encodes the plain text with the tokenizer's special tokens otherwise.

``pad_prompts`` left-pads every prompt to exactly ``max_prompt_len`` tokens (not to the longest
prompt of the batch): the prompt block of a sample is ``[pad ... pad, p_0 ... p_k]`` and every
prompt ends at the same column, where generation starts. ``pad_responses`` right-pads every
response to exactly ``max_response_len``. So ``[n, max_prompt_len + max_response_len]`` is the
shape of every batch of ``n`` samples and a micro-shard's shapes never depend on its content or
on which cell computes it; ``join`` puts the two blocks side by side with the attention mask,
position ids that ignore the left padding, and the loss mask of the rollout layout. A prompt
longer than ``max_prompt_len`` (or a response longer than ``max_response_len``) is a
``ConfigError`` naming its source: nothing is truncated silently.

Arrays are numpy (``int64`` ids, ``bool`` masks; ``torch.from_numpy`` shares them).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ftkit.errors import ConfigError
from ftkit.tasks.protocols import PromptRecord, Tokenizer


@dataclass(frozen=True)
class Encoded:
    """One prompt ready for an engine: its text as the model sees it and its token ids."""

    record: PromptRecord
    text: str
    ids: list[int]


@dataclass(frozen=True)
class Padded:
    """A padded block: ``ids`` int64 ``[n, width]``, ``mask`` bool ``[n, width]`` (True on real
    tokens), ``lengths`` int64 ``[n]`` (real tokens per row)."""

    ids: np.ndarray
    mask: np.ndarray
    lengths: np.ndarray


def has_chat_template(tokenizer: Tokenizer) -> bool:
    """Whether the tokenizer carries a chat template (``transformers``: a non-empty ``chat_template``)."""
    return bool(getattr(tokenizer, "chat_template", None)) and hasattr(tokenizer, "apply_chat_template")


def render_prompt(tokenizer: Tokenizer, record: PromptRecord, system: str | None = None) -> Encoded:
    """``record`` as the model sees it: chat-templated where the tokenizer has a template.

    ``system`` is an optional system message (templates only; without a template it is an error
    to pass one, as there is nowhere to put it).
    """
    if has_chat_template(tokenizer):
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": record.text}
        ]
        text: Any = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)  # type: ignore[attr-defined]
        if not isinstance(text, str):
            raise ConfigError(
                f"the tokenizer's chat template returned a {type(text).__name__}, not text",
                hint="use a tokenizer whose apply_chat_template(..., tokenize=False) returns a string",
            )
        return Encoded(record, text, list(tokenizer.encode(text, add_special_tokens=False)))
    if system:
        raise ConfigError("a system prompt needs a tokenizer with a chat template", hint="drop the system prompt")
    return Encoded(record, record.text, list(tokenizer.encode(record.text, add_special_tokens=True)))


def encode_prompts(
    tokenizer: Tokenizer, records: Iterable[PromptRecord], max_prompt_len: int, system: str | None = None
) -> list[Encoded]:
    """``render_prompt`` of each record, checked against ``max_prompt_len`` as it is encoded."""
    out = []
    for record in records:
        enc = render_prompt(tokenizer, record, system)
        _check_len(len(enc.ids), max_prompt_len, f"prompt at {record.source}", "--max-prompt-len")
        out.append(enc)
    return out


def pad_prompts(prompts: Sequence[Sequence[int]], max_prompt_len: int, pad_id: int) -> Padded:
    """Left-pad each prompt to exactly ``max_prompt_len`` tokens."""
    return _pad(prompts, max_prompt_len, pad_id, left=True, what="prompt", option="--max-prompt-len")


def pad_responses(responses: Sequence[Sequence[int]], max_response_len: int, pad_id: int) -> Padded:
    """Right-pad each response to exactly ``max_response_len`` tokens."""
    return _pad(responses, max_response_len, pad_id, left=False, what="response", option="--max-response-len")


@dataclass(frozen=True)
class Sequences:
    """Prompt and response blocks joined, every array ``[n, P + R]``:

    ``tokens`` int64; ``attention_mask`` bool (real tokens); ``position_ids`` int64, counting from 0
    at each sample's first real token (so left padding does not shift a prompt's positions; 0 on
    padding before it); ``loss_mask`` float32, 1 at position ``t`` where token ``t+1`` is a real
    response token (the layout of the rollout batch: the token predicted at ``t`` is learned).
    """

    tokens: np.ndarray
    attention_mask: np.ndarray
    position_ids: np.ndarray
    loss_mask: np.ndarray


def join(prompts: Padded, responses: Padded) -> Sequences:
    """``[left-padded prompt | right-padded response]`` per sample, with its masks and positions."""
    if prompts.ids.shape[0] != responses.ids.shape[0]:
        raise ValueError(f"{prompts.ids.shape[0]} prompts but {responses.ids.shape[0]} responses")
    tokens = np.concatenate([prompts.ids, responses.ids], axis=1)
    attention = np.concatenate([prompts.mask, responses.mask], axis=1)
    positions = np.maximum(np.cumsum(attention, axis=1) - 1, 0).astype(np.int64)
    loss_mask = np.zeros(tokens.shape, dtype=np.float32)
    width = prompts.ids.shape[1]
    loss_mask[:, width - 1 : -1] = responses.mask[:, :]
    return Sequences(tokens, attention, positions, loss_mask)


def pad_id_of(tokenizer: Tokenizer, pad_id: int | None = None) -> int:
    """The pad id: ``pad_id`` when given, else the tokenizer's; an error when neither exists."""
    if pad_id is not None:
        return pad_id
    if tokenizer.pad_token_id is None:
        raise ConfigError("the tokenizer has no pad token", hint="name a pad token id (e.g. the eos id)")
    return int(tokenizer.pad_token_id)


def _pad(rows: Sequence[Sequence[int]], width: int, pad_id: int, *, left: bool, what: str, option: str) -> Padded:
    if width < 1:
        raise ConfigError(f"the maximum {what} length must be at least 1, not {width}", hint=f"set {option}")
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=bool)
    lengths = np.zeros(len(rows), dtype=np.int64)
    for i, row in enumerate(rows):
        n = len(row)
        _check_len(n, width, f"{what} {i}", option)
        cols = slice(width - n, width) if left else slice(0, n)
        ids[i, cols] = np.asarray(row, dtype=np.int64)
        mask[i, cols] = True
        lengths[i] = n
    return Padded(ids, mask, lengths)


def _check_len(n: int, width: int, what: str, option: str) -> None:
    if n > width:
        raise ConfigError(
            f"{what} has {n} tokens, more than the maximum of {width}",
            hint=f"raise {option} to at least {n} or shorten the {what.split()[0]}s; nothing is truncated",
        )
    if n == 0:
        raise ConfigError(f"{what} has no tokens", hint="every prompt and response needs at least one token")
