"""vLLM's Llama layout mapped back to Hugging Face names, whatever the engine's TP.

vLLM holds a Llama with fused and sharded weights: per TP rank ``qkv_proj`` is
``[q rows of this rank; k rows; v rows]`` (key/value heads replicated over ranks when TP is
larger than their number), ``gate_up_proj`` is ``[gate rows; up rows]``, ``o_proj`` and
``down_proj`` are split on their input dimension, ``embed_tokens`` and ``lm_head`` on the
(padded) vocabulary; norms are replicated. ``to_hf(shards, shape)`` takes every rank's
``{vLLM name: tensor}`` (rank order) and returns the full Hugging Face-named tensors, so the
fingerprint of what the engine holds is comparable with the fingerprint of what the trainer
sent, whatever the trainer's TP and the engine's.

Contract: ``to_hf`` only slices and concatenates (bytes are never converted); a replicated
piece (norms, key/value heads at TP > kv heads) must be bitwise equal on every rank that
holds it, else ``LayoutError``; an unknown name raises ``LayoutError`` (a new fused layout
must be mapped here, never fingerprinted under its vLLM name by accident). Needs torch only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch


class LayoutError(ValueError):
    """The engine's tensors do not fit the Llama layout they were declared to have."""


@dataclass(frozen=True)
class LlamaShape:
    """The shape facts of a Llama config that the fused layouts depend on."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, object]) -> LlamaShape:
        """From a Hugging Face ``config.json`` dict."""

        def get(key: str, default: int | None = None) -> int:
            value = cfg.get(key) or default
            if not isinstance(value, int):
                raise LayoutError(f"config.json: {key} is {value!r}, not an integer")
            return value

        heads = get("num_attention_heads")
        return cls(
            num_heads=heads,
            num_kv_heads=get("num_key_value_heads", heads),
            head_dim=get("head_dim", get("hidden_size") // heads),
            vocab_size=get("vocab_size"),
        )


_QKV = re.compile(r"^(.*\.self_attn)\.qkv_proj\.(weight|bias)$")
_GATE_UP = re.compile(r"^(.*\.mlp)\.gate_up_proj\.(weight|bias)$")
_ROW = re.compile(r"^.*\.(o_proj|down_proj)\.weight$")
_VOCAB = re.compile(r"^(model\.embed_tokens|lm_head)\.weight$")
_REPLICATED = re.compile(r"^.*(norm)\.weight$|^.*\.(o_proj|down_proj)\.bias$")


def to_hf(shards: Sequence[Mapping[str, torch.Tensor]], shape: LlamaShape) -> dict[str, torch.Tensor]:
    """Full Hugging Face-named tensors from every TP rank's vLLM-named tensors (rank order)."""
    import torch

    tp = len(shards)
    if tp == 0:
        raise LayoutError("no shards")
    names = list(shards[0])
    for r, s in enumerate(shards[1:], 1):
        if list(s) != names:
            raise LayoutError(f"rank {r} holds other tensors than rank 0")
    out: dict[str, torch.Tensor] = {}
    for name in names:
        pieces = [s[name] for s in shards]
        if m := _QKV.match(name):
            q, k, v = _split_qkv(pieces, shape, name)
            out.update({f"{m[1]}.q_proj.{m[2]}": q, f"{m[1]}.k_proj.{m[2]}": k, f"{m[1]}.v_proj.{m[2]}": v})
        elif m := _GATE_UP.match(name):
            halves = [p.chunk(2, 0) for p in pieces]
            if any(h[0].shape != h[1].shape for h in halves):
                raise LayoutError(f"{name}: odd number of rows {pieces[0].shape[0]}")
            out[f"{m[1]}.gate_proj.{m[2]}"] = torch.cat([h[0] for h in halves])
            out[f"{m[1]}.up_proj.{m[2]}"] = torch.cat([h[1] for h in halves])
        elif _ROW.match(name):
            out[name] = torch.cat(pieces, 1)
        elif _VOCAB.match(name):
            full = torch.cat(pieces, 0)
            if full.shape[0] < shape.vocab_size:
                raise LayoutError(f"{name}: {full.shape[0]} rows for a vocabulary of {shape.vocab_size}")
            out[name] = full[: shape.vocab_size]
        elif _REPLICATED.match(name):
            out[name] = _one_of(pieces, name, range(tp))
        else:
            raise LayoutError(f"{name}: no known Hugging Face mapping for this vLLM tensor")
    return out


def _one_of(pieces: Sequence[torch.Tensor], name: str, ranks: Sequence[int]) -> torch.Tensor:
    """The piece held by ``ranks`` (all must be bitwise equal)."""
    import torch

    first = pieces[ranks[0]]
    for r in ranks[1:]:
        p = pieces[r]
        if p.shape != first.shape or not torch.equal(p.view(torch.uint8), first.view(torch.uint8)):
            raise LayoutError(f"{name}: the replica on rank {r} differs from rank {ranks[0]}'s")
    return first


def _split_qkv(
    pieces: Sequence[torch.Tensor], shape: LlamaShape, name: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, k, v) full tensors from per-rank ``[q; k; v]`` rows (kv heads replicated at tp > kv)."""
    import torch

    tp, hd = len(pieces), shape.head_dim
    if shape.num_heads % tp:
        raise LayoutError(f"{name}: {shape.num_heads} heads do not split over TP {tp}")
    q_rows = shape.num_heads // tp * hd
    kv_heads = max(1, shape.num_kv_heads // tp)
    kv_rows = kv_heads * hd
    for r, p in enumerate(pieces):
        if p.shape[0] != q_rows + 2 * kv_rows:
            raise LayoutError(f"{name}: rank {r} has {p.shape[0]} rows, expected {q_rows + 2 * kv_rows}")
    q = torch.cat([p[:q_rows] for p in pieces])
    replicas = max(1, tp // shape.num_kv_heads)
    groups = [list(range(g * replicas, (g + 1) * replicas)) for g in range(tp // replicas)]
    ks = [_one_of([p[q_rows : q_rows + kv_rows] for p in pieces], name + " (k)", g) for g in groups]
    vs = [_one_of([p[q_rows + kv_rows :] for p in pieces], name + " (v)", g) for g in groups]
    return q, torch.cat(ks), torch.cat(vs)
