"""Import -> export of Hugging Face checkpoints without megatron: the per-rank slices streamed by
``hf_import`` and merged back by ``hf_export``, at TP 1, 2 and 4, for every family."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from ftkit.model import hf_import
from ftkit.model.families import load_arch
from ftkit.model.hf_export import export_hf, hf_tensors
from ftkit.model.hf_import import CheckpointFiles, check_tensors, rank_tensors
from ftkit.model.hf_layout import entries
from tests.model.hf_models import FAMILIES, make_model


def rank_states(model_dir: Path, tp: int) -> list[dict[str, torch.Tensor]]:
    arch = load_arch(model_dir)
    files = CheckpointFiles(model_dir)
    check_tensors(files, arch)
    names = [e.megatron for e in entries(arch) if not (arch.tied and e.megatron == "output_layer.weight")]
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
        assert emb.shape == (256, 128)  # 300 padded to a multiple of 128 * TP = 512 at TP=2
    assert torch.equal(states[1]["embedding.word_embeddings.weight"][300 - 256 :], torch.zeros(512 - 300, 128))


def test_import_reads_only_slices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory bound: every read is a get_slice of this rank's share; no whole tensor is loaded
    (get_tensor), and no rank reads more than its share."""
    src = make_model("llama", tmp_path)
    read_elems: list[int] = []
    whole: list[str] = []

    class Handle:
        def __init__(self, inner: object) -> None:
            self.inner = inner

        def keys(self) -> list[str]:
            return self.inner.keys()  # type: ignore[attr-defined]

        def get_tensor(self, name: str) -> None:
            whole.append(name)
            raise AssertionError("import must not read a whole tensor")

        def get_slice(self, name: str) -> object:
            part = self.inner.get_slice(name)  # type: ignore[attr-defined]

            class Slice:
                def get_shape(self) -> list[int]:
                    return part.get_shape()

                def __getitem__(self, index: object) -> torch.Tensor:
                    t = part[index]
                    read_elems.append(t.numel())
                    return t

            return Slice()

    real = hf_import.CheckpointFiles._open
    monkeypatch.setattr(hf_import.CheckpointFiles, "_open", lambda self, f: Handle(real(self, f)))
    states = rank_states(src, 2)
    assert not whole
    held = sum(t.numel() for t in states[0].values())
    padding = (512 - 300) * 128  # zero rows rank 1 holds beyond the real vocabulary
    assert sum(read_elems) == 2 * held - padding  # both ranks: exactly their own shares, nothing twice
    assert max(read_elems) <= max(t.numel() for t in states[0].values())


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
