"""Import -> export of Hugging Face checkpoints without megatron: the per-rank slices streamed by
``hf_import`` and merged back by ``hf_export``, at TP 1, 2 and 4, for every family."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from ftkit.model import hf_import
from ftkit.model.families import load_arch
from ftkit.model.hf_config import HFArch
from ftkit.model.hf_export import export_hf, hf_tensors
from ftkit.model.hf_import import CheckpointFiles, check_tensors, load_rank, rank_tensors
from ftkit.model.hf_layout import entries
from tests.model.hf_models import FAMILIES, make_model


def rank_states(model_dir: Path, tp: int) -> list[dict[str, torch.Tensor]]:
    arch = load_arch(model_dir)
    names = [e.megatron for e in entries(arch) if not (arch.tied and e.megatron == "output_layer.weight")]
    with CheckpointFiles(model_dir) as files:
        check_tensors(files, arch)
        return [dict(rank_tensors(files, arch, names, r, tp)) for r in range(tp)]


def source_tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def exported(out: Path) -> dict[str, torch.Tensor]:
    index = json.loads((out / "model.safetensors.index.json").read_text())
    tensors = source_tensors(out)
    assert set(index["weight_map"]) == set(tensors)
    return tensors


@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_bitwise_and_tp_invariant(family: str, tmp_path: Path) -> None:
    src = make_model(family, tmp_path)
    arch = load_arch(src)
    source = source_tensors(src)
    outs = {}
    for tp in (1, 2):
        out = tmp_path / f"out-tp{tp}"
        export_hf(rank_states(src, tp), arch, out, src, max_shard_bytes=200_000)
        outs[tp] = out
        got = exported(out)
        assert set(got) == set(source)
        for name, t in source.items():
            assert got[name].dtype == t.dtype and torch.equal(got[name].view(torch.uint8), t.view(torch.uint8)), name
    shards = sorted(p.name for p in outs[1].glob("*.safetensors"))
    assert len(shards) > 1  # the shard limit split the model
    for name in shards:  # TP=2 writes the very bytes TP=1 writes
        assert (outs[1] / name).read_bytes() == (outs[2] / name).read_bytes()
    assert (outs[1] / "model.safetensors.index.json").read_bytes() == (
        outs[2] / "model.safetensors.index.json"
    ).read_bytes()


def test_fused_qkv_is_grouped_as_megatron_lays_it_out(tmp_path: Path) -> None:
    """Rank r of linear_qkv holds, per query group, its 2 query heads, then its key, then its value head."""
    src = make_model("qwen2", tmp_path)
    source = source_tensors(src)
    d = 32
    q, k, v = (source[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv")
    states = rank_states(src, 2)
    for r in range(2):
        fused = states[r]["decoder.layers.0.self_attention.linear_qkv.weight"]
        assert fused.shape == (4 * d, 128)  # one group of 2 q + k + v heads per rank
        assert torch.equal(fused[: 2 * d], q[r * 2 * d : (r + 1) * 2 * d])
        assert torch.equal(fused[2 * d : 3 * d], k[r * d : (r + 1) * d])
        assert torch.equal(fused[3 * d :], v[r * d : (r + 1) * d])
        fc1 = states[r]["decoder.layers.0.mlp.linear_fc1.weight"]
        gate, up = source["model.layers.0.mlp.gate_proj.weight"], source["model.layers.0.mlp.up_proj.weight"]
        assert torch.equal(fc1[:128], gate[r * 128 : (r + 1) * 128]) and torch.equal(
            fc1[128:], up[r * 128 : (r + 1) * 128]
        )
        emb = states[r]["embedding.word_embeddings.weight"]
        assert emb.shape == (512, 128)  # 300 padded to a multiple of 1024 at every TP
    assert torch.equal(states[0]["embedding.word_embeddings.weight"][300:], torch.zeros(512 - 300, 128))
    assert torch.equal(states[1]["embedding.word_embeddings.weight"], torch.zeros(512, 128))  # padding only


def test_import_reads_only_slices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory bound: every byte read from the files (``preadv`` of row ranges, column copies
    from the memory map) is this rank's share, read once, and no single read is larger than one
    parameter slice (replicated tensors are read by each rank that holds them)."""
    src = make_model("llama", tmp_path)
    reads: list[int] = []
    real_preadv, real_columns = os.preadv, CheckpointFiles._copy_columns

    def preadv(fd: int, buffers: list[memoryview], offset: int) -> int:
        n = real_preadv(fd, buffers, offset)
        reads.append(n)
        return n

    def columns(self: CheckpointFiles, name: str, info: object, lo: int, hi: int, out: torch.Tensor) -> None:
        reads.append((hi - lo) * out.shape[0])
        real_columns(self, name, info, lo, hi, out)  # type: ignore[arg-type]

    monkeypatch.setattr(hf_import.os, "preadv", preadv)
    monkeypatch.setattr(CheckpointFiles, "_copy_columns", columns)
    states = rank_states(src, 2)
    held = sum(t.numel() * t.element_size() for state in states for t in state.values())
    padding = (1024 - 300) * 128 * 4  # zero rows beyond the real vocabulary (all of rank 1's), not read
    assert sum(reads) == held - padding  # both ranks: exactly their own shares, nothing twice
    assert max(reads) <= max(t.numel() * t.element_size() for t in states[0].values())


def reference_rank(source: dict[str, torch.Tensor], arch: HFArch, r: int, t: int) -> dict[str, torch.Tensor]:
    """Rank r's tensors built the obvious way from whole tensors (the oracle): slices, torch.cat
    of the grouped q, k, v and of gate, up, and zero rows padding the vocabulary."""

    def share(n: int) -> slice:
        return slice(r * n // t, (r + 1) * n // t)

    d, rep, groups = arch.head_dim, arch.num_heads // arch.num_kv_heads, arch.num_kv_heads // t
    out = {}
    for e in entries(arch):
        if arch.tied and e.megatron == "output_layer.weight":
            continue
        x = [source[n] for n in e.hf]
        if e.kind == "replicated":
            y = x[0]
        elif e.kind == "row":
            y = x[0][:, share(x[0].shape[1])]
        elif e.kind == "vocab":
            padded = torch.cat([x[0], x[0].new_zeros(arch.padded_vocab - arch.vocab_size, x[0].shape[1])])
            y = padded[share(padded.shape[0])]
        elif e.kind == "fc1":
            y = torch.cat([x[0][share(x[0].shape[0])], x[1][share(x[1].shape[0])]])
        else:
            q, k, v = (p[share(p.shape[0])] for p in x)
            rest = tuple(q.shape[1:])
            grouped = [q.reshape(groups, rep * d, *rest), k.reshape(groups, d, *rest), v.reshape(groups, d, *rest)]
            y = torch.cat(grouped, 1).reshape(-1, *rest)
        out[e.megatron] = y
    return out


def to_bf16(model_dir: Path) -> None:
    """Rewrite ``model_dir``'s weights as bfloat16 (what most published checkpoints are)."""
    from safetensors.torch import save_file

    for f in model_dir.glob("*.safetensors"):
        save_file({k: v.to(torch.bfloat16) for k, v in load_file(f).items()}, str(f), metadata={"format": "pt"})


@pytest.mark.parametrize(
    ("family", "overrides", "bf16"),
    [
        ("llama", {}, False),  # tied embeddings
        ("llama", {"tie_word_embeddings": False}, True),
        ("qwen2", {}, False),  # QKV bias
        ("qwen2", {}, True),
    ],
    ids=["llama-tied", "llama-untied-bf16", "qwen2-bias", "qwen2-bias-bf16"],
)
def test_reader_matches_the_safetensors_reference(
    family: str, overrides: dict[str, object], bf16: bool, tmp_path: Path
) -> None:
    """Every rank tensor, fresh (``rank_tensors``, the checkpoint's dtype) and filled into existing
    float32 parameters (``load_rank``, what ``load_into`` does: cast on the way), is bitwise the
    reference built from safetensors' own ``load_file``, at TP 1 and 2; the destination's padding
    rows are zeroed even when they held something."""
    src = make_model(family, tmp_path, **overrides)
    if bf16:
        to_bf16(src)
    arch = load_arch(src)
    source = source_tensors(src)
    for tp in (1, 2):
        states = rank_states(src, tp)
        for r in range(tp):
            want = reference_rank(source, arch, r, tp)
            assert set(states[r]) == set(want)
            dests = {n: torch.full(w.shape, float("nan"), dtype=torch.float32) for n, w in want.items()}
            with CheckpointFiles(src) as files:
                load_rank(files, arch, dests, r, tp)
            for name, w in want.items():
                got = states[r][name]
                assert got.dtype == w.dtype and torch.equal(got.view(torch.uint8), w.view(torch.uint8)), name
                assert torch.equal(dests[name], w.float()), name


def test_a_strided_destination_is_filled_through_a_copy(tmp_path: Path) -> None:
    """A parameter that is not contiguous (or not on the CPU) is filled through a staging tensor."""
    src = make_model("qwen2", tmp_path)
    arch = load_arch(src)
    name = "decoder.layers.0.self_attention.linear_proj.weight"
    want = reference_rank(source_tensors(src), arch, 1, 2)[name]
    dest = torch.zeros(want.shape[1], want.shape[0]).t()
    with CheckpointFiles(src) as files:
        load_rank(files, arch, {name: dest}, 1, 2)
    assert torch.equal(dest, want)


def test_missing_and_unmapped_tensors_are_config_errors(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from ftkit.model.hf_config import ModelConfigError

    src = make_model("llama", tmp_path)
    arch = load_arch(src)
    tensors = source_tensors(src)
    tensors["model.layers.0.self_attn.o_proj.bias"] = torch.zeros(128)
    for f in src.glob("*.safetensors"):
        f.unlink()
    save_file(tensors, str(src / "model.safetensors"))
    with pytest.raises(ModelConfigError, match="o_proj.bias"):
        check_tensors(CheckpointFiles(src), arch)
    del tensors["model.layers.0.self_attn.o_proj.bias"], tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(src / "model.safetensors"))
    with pytest.raises(ModelConfigError, match="layers.1.mlp.up_proj"):
        check_tensors(CheckpointFiles(src), arch)


def test_hf_tensors_merges_in_memory(tmp_path: Path) -> None:
    src = make_model("qwen3", tmp_path)
    merged = hf_tensors(rank_states(src, 2), load_arch(src))
    with safe_open(str(next(src.glob("*.safetensors"))), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open is not iterable
            assert torch.equal(merged[name], f.get_tensor(name))
