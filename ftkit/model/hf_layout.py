"""Hugging Face names and layouts <-> megatron-core's, per tensor-parallel rank.

``entries(arch, te=False)`` lists one ``Entry`` per megatron parameter of the whole model (layer
numbering model-wide, as ``ftkit.model.stages.global_param_name`` gives it) with the Hugging Face
tensor(s) it is made of and its ``kind``:

==========  ==========================================================================
kind        rank ``r`` of ``t`` TP ranks holds
==========  ==========================================================================
replicated  the whole tensor (norm weights, QK-norm weights)
row         columns ``[r*n/t, (r+1)*n/t)`` (``o_proj``, ``down_proj``)
vocab       rows ``[r*Vp/t, (r+1)*Vp/t)`` of the vocabulary padded to ``Vp`` with zero rows
qkv         megatron's fused ``linear_qkv``: for each of its ``kv/t`` query groups ``g`` the
            ``heads/kv`` query heads of ``g``, then ``g``'s key head, then its value head
            (weight and, for Qwen2, bias)
fc1         megatron's fused SwiGLU ``linear_fc1``: ``[gate rows of r; up rows of r]``
==========  ==========================================================================

``rank_plan(entry, arch, r, t)`` says how rank ``r``'s tensor is made: its shape, the ``Part``s
it is read from (rows or columns ``[start, stop)`` of one Hugging Face tensor, landing at
destination row ``at``; a fused tensor is one part per query group's q, k and v rows or per gate
and up half) and the padding rows to zero, so a reader copies every byte of this rank's share
once, straight into its place, and nothing of another rank's share; ``merge(entry, arch,
pieces)`` is the inverse (every rank's tensor -> the Hugging Face tensors, padding removed).
With TE (``te=True``) the layer norms live in the fused linears (megatron's
``sharded_state_dict_keys_map``): ``self_attention.linear_qkv.layer_norm_weight`` and
``mlp.linear_fc1.layer_norm_weight``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ftkit.model.hf_config import HFArch

if TYPE_CHECKING:  # pragma: no cover
    import torch

EMBED, LM_HEAD, FINAL_NORM = "model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"


@dataclass(frozen=True)
class Entry:
    megatron: str
    hf: tuple[str, ...]
    kind: str  # replicated | row | vocab | qkv | fc1


def entries(arch: HFArch, te: bool = False) -> list[Entry]:
    """Every megatron parameter of the model (PP=1 naming) and its Hugging Face sources."""
    ln_attn = "self_attention.linear_qkv.layer_norm_weight" if te else "input_layernorm.weight"
    ln_mlp = "mlp.linear_fc1.layer_norm_weight" if te else "pre_mlp_layernorm.weight"
    out = [Entry("embedding.word_embeddings.weight", (EMBED,), "vocab")]
    for i in range(arch.num_layers):
        m, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        a = h + "self_attn."
        out.append(Entry(m + ln_attn, (h + "input_layernorm.weight",), "replicated"))
        out.append(Entry(m + "self_attention.linear_qkv.weight", tuple(f"{a}{p}_proj.weight" for p in "qkv"), "qkv"))
        if arch.qkv_bias:
            out.append(Entry(m + "self_attention.linear_qkv.bias", tuple(f"{a}{p}_proj.bias" for p in "qkv"), "qkv"))
        if arch.qk_norm:
            out.append(Entry(m + "self_attention.q_layernorm.weight", (a + "q_norm.weight",), "replicated"))
            out.append(Entry(m + "self_attention.k_layernorm.weight", (a + "k_norm.weight",), "replicated"))
        out.append(Entry(m + "self_attention.linear_proj.weight", (a + "o_proj.weight",), "row"))
        out.append(Entry(m + ln_mlp, (h + "post_attention_layernorm.weight",), "replicated"))
        mlp = h + "mlp."
        out.append(Entry(m + "mlp.linear_fc1.weight", (mlp + "gate_proj.weight", mlp + "up_proj.weight"), "fc1"))
        out.append(Entry(m + "mlp.linear_fc2.weight", (mlp + "down_proj.weight",), "row"))
    out.append(Entry("decoder.final_layernorm.weight", (FINAL_NORM,), "replicated"))
    # Tied: megatron has an output_layer.weight only on a last stage that lacks the embedding
    # (PP > 1), a copy of the embedding; export takes the embedding's.
    out.append(Entry("output_layer.weight", (EMBED if arch.tied else LM_HEAD,), "vocab"))
    return out


def hf_shapes(arch: HFArch) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face tensor of the model and its shape, in checkpoint order."""
    h, d, f = arch.hidden_size, arch.head_dim, arch.ffn_hidden_size
    rows = {"q": arch.num_heads * d, "k": arch.num_kv_heads * d, "v": arch.num_kv_heads * d}
    out: dict[str, tuple[int, ...]] = {EMBED: (arch.vocab_size, h)}
    for i in range(arch.num_layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = (h,)
        for k, n in rows.items():
            out[f"{p}self_attn.{k}_proj.weight"] = (n, h)
            if arch.qkv_bias:
                out[f"{p}self_attn.{k}_proj.bias"] = (n,)
        if arch.qk_norm:
            out[p + "self_attn.q_norm.weight"] = (d,)
            out[p + "self_attn.k_norm.weight"] = (d,)
        out[p + "self_attn.o_proj.weight"] = (h, arch.num_heads * d)
        out[p + "post_attention_layernorm.weight"] = (h,)
        out[p + "mlp.gate_proj.weight"] = (f, h)
        out[p + "mlp.up_proj.weight"] = (f, h)
        out[p + "mlp.down_proj.weight"] = (h, f)
    out[FINAL_NORM] = (h,)
    if not arch.tied:
        out[LM_HEAD] = (arch.vocab_size, h)
    return out


def _share(n: int, r: int, t: int) -> tuple[int, int]:
    size = n // t
    return r * size, (r + 1) * size


@dataclass(frozen=True)
class Part:
    """Rows (``dim`` 0) or columns (``dim`` 1) ``[start, stop)`` of Hugging Face tensor ``hf``, or
    all of it (``dim`` None). Rows land in destination rows ``[at, at + stop - start)``; columns
    and whole tensors fill the whole destination."""

    hf: str
    dim: int | None
    start: int
    stop: int
    at: int = 0


@dataclass(frozen=True)
class Plan:
    """Rank ``r``'s tensor of one entry: ``shape``, the ``parts`` that fill it (disjoint), and the
    vocabulary padding: rows ``[zero_from, shape[0])``, zero (``zero_from == shape[0]``: none)."""

    shape: tuple[int, ...]
    parts: tuple[Part, ...]
    zero_from: int


def rank_plan(e: Entry, arch: HFArch, r: int, t: int) -> Plan:
    """How rank ``r`` (of ``t``) builds its tensor of entry ``e`` (module docstring)."""
    h, d = arch.hidden_size, arch.head_dim
    if e.kind == "replicated":
        n = d if e.hf[0].endswith(("q_norm.weight", "k_norm.weight")) else h
        return Plan((n,), (Part(e.hf[0], None, 0, 0),), n)
    if e.kind == "row":  # o_proj's columns are the attention heads, down_proj's the MLP's
        n = arch.num_heads * d if e.hf[0].endswith("o_proj.weight") else arch.ffn_hidden_size
        start, stop = _share(n, r, t)
        return Plan((h, stop - start), (Part(e.hf[0], 1, start, stop),), h)
    if e.kind == "vocab":
        start, stop = _share(arch.padded_vocab, r, t)
        real = max(0, min(stop, arch.vocab_size) - start)
        parts = (Part(e.hf[0], 0, start, start + real),) if real else ()
        return Plan((stop - start, h), parts, real)
    rest: tuple[int, ...] = () if e.megatron.endswith(".bias") else (h,)
    if e.kind == "qkv":
        rep, groups = arch.num_heads // arch.num_kv_heads, arch.num_kv_heads // t
        q0, k0, size = r * groups * rep * d, r * groups * d, (rep + 2) * d
        fused: list[Part] = []
        for g in range(groups):
            base, q, k = g * size, q0 + g * rep * d, k0 + g * d
            fused.append(Part(e.hf[0], 0, q, q + rep * d, base))
            fused.append(Part(e.hf[1], 0, k, k + d, base + rep * d))
            fused.append(Part(e.hf[2], 0, k, k + d, base + (rep + 1) * d))
        return Plan((groups * size, *rest), tuple(fused), groups * size)
    if e.kind == "fc1":
        start, stop = _share(arch.ffn_hidden_size, r, t)
        n = stop - start
        return Plan((2 * n, h), (Part(e.hf[0], 0, start, stop), Part(e.hf[1], 0, start, stop, n)), 2 * n)
    raise ValueError(f"unknown entry kind {e.kind!r}")


def _cat(pieces: Sequence[torch.Tensor], dim: int) -> torch.Tensor:
    """``torch.cat`` of the pieces; the piece itself (no copy) when there is one (TP = 1)."""
    import torch

    return pieces[0] if len(pieces) == 1 else torch.cat(list(pieces), dim)


def merge(e: Entry, arch: HFArch, pieces: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The Hugging Face tensor(s) of entry ``e`` from every TP rank's piece (rank order). At
    TP = 1 the results are views of the piece where the layout allows (every kind but ``qkv``,
    whose q, k and v rows interleave): callers that keep them must not write the pieces."""
    import torch

    if e.kind == "replicated":
        first = pieces[0]
        for i, p in enumerate(pieces[1:], 1):
            if not torch.equal(p, first):
                raise ValueError(f"{e.megatron}: TP rank {i} holds other values than rank 0 (a replicated tensor)")
        return {e.hf[0]: first}
    if e.kind == "row":
        return {e.hf[0]: _cat(pieces, 1)}
    if e.kind == "vocab":
        return {e.hf[0]: _cat(pieces, 0)[: arch.vocab_size]}
    if e.kind == "fc1":
        halves = [p.chunk(2, 0) for p in pieces]
        return {e.hf[0]: _cat([g for g, _ in halves], 0), e.hf[1]: _cat([u for _, u in halves], 0)}
    if e.kind == "qkv":
        d, rep = arch.head_dim, arch.num_heads // arch.num_kv_heads
        parts: list[list[torch.Tensor]] = [[], [], []]
        for p in pieces:
            rest = tuple(p.shape[1:])
            g = p.reshape(-1, (rep + 2) * d, *rest)
            for i, x in enumerate(g.split([rep * d, d, d], 1)):
                parts[i].append(x.reshape(-1, *rest))
        return {name: _cat(ps, 0) for name, ps in zip(e.hf, parts)}
    raise ValueError(f"unknown entry kind {e.kind!r}")
