"""ModuleCapture on a real megatron-core GPT: a TP=2 dump (two gloo ranks) reassembles into
the TP=1 dump of the same seed, tensor for tensor."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.multiprocessing as mp

from ftkit.dumps.compare import CompareOptions, compare_paths
from ftkit.dumps.sources import open_source

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, out: str, labels: bool = False) -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from ftkit.dumps.capture import ModuleCapture
    from ftkit.dumps.layout import microshard_writer
    from ftkit.dumps.writer import DumpWriter
    from ftkit.model.gpt import build_gpt, configure_determinism
    from ftkit.train.config import TrainConfig
    from ftkit.train.plan.run_plan import build_plan

    configure_determinism(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    ps.initialize_model_parallel(world, 1, create_gloo_process_groups=False)
    model = build_gpt(build_plan(TrainConfig(seed=7)).model, 7, "cpu")
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 15, (2, 6), generator=g)
    pos = torch.arange(6).unsqueeze(0).expand(2, -1)
    with ModuleCapture(model, activations=True, grads=True, params=True) as cap:
        if labels:  # per-token loss of the vocab-parallel cross entropy: the same on every TP rank
            model(tokens, pos, None, labels=torch.roll(tokens, -1, 1)).float().mean().backward()
        else:
            logits = model(tokens, pos, None)  # vocab-parallel: each TP rank holds its slice
            (logits.float().pow(2).sum() / logits.shape[0]).backward()
    dw = DumpWriter(out, "actor", "fwd_bwd", 0, microshard_writer(0, 0, rank, 0), meta={"cell": 0, "rank": rank})
    cap.write_to(dw, step=0, micro_shard=0)
    dw.write()
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def _dump(tmp_path, world: int, labels: bool = False):
    out = tmp_path / f"tp{world}{'-labels' if labels else ''}"
    mp.spawn(_rank, args=(world, _free_port(), str(out), labels), nprocs=world, join=True)
    return out


def test_tp2_dump_reassembles_into_the_tp1_dump(tmp_path):
    tp1, tp2 = _dump(tmp_path, 1), _dump(tmp_path, 2)
    entries = open_source(tp2).entries
    split = {e.name for e in entries if e.sharding.is_split}
    assert {
        "decoder.layers.0.self_attention.linear_qkv.output.0",
        "decoder.layers.0.mlp.linear_fc1.output.0",
        "decoder.layers.0.self_attention.core_attention.output",
        "output_layer.output.0",
        "output",
        "decoder.layers.0.mlp.linear_fc1.weight.param",
        "decoder.layers.1.self_attention.linear_proj.weight.grad",
        "output_layer.output_grad.0",
    } <= split
    result = compare_paths(tp1, tp2, CompareOptions(mode="tolerance", rtol=1e-4, atol=1e-6))
    bad = [f.message for f in result.findings]
    assert bad == [], bad[:5]
    assert result.stats["tensors"] == len({e.key for e in open_source(tp1).entries}) > 90
    statuses = {p.name: p.status for p in result.pairs}
    # Initial weights are TP slices of the same master weights: bitwise equal after reassembly.
    assert all(s == "equal" for n, s in statuses.items() if n.endswith(".param")), statuses
    # Replicated tensors were written by both TP ranks: the copies were checked bitwise (CD007).
    assert {"decoder.layers.0.input_layernorm.weight.param", "embedding.output"} <= {
        e.name for e in entries if not e.sharding.is_split
    }


def test_tp2_per_token_loss_is_replicated_and_compares_with_tp1(tmp_path):
    tp1, tp2 = _dump(tmp_path, 1, labels=True), _dump(tmp_path, 2, labels=True)
    entries = open_source(tp2).entries
    loss = [e for e in entries if e.name in ("output", "output_grad")]
    assert {e.name for e in loss} == {"output", "output_grad"}
    assert not any(e.sharding.is_split for e in loss)  # both TP ranks hold the whole [b, s] loss
    result = compare_paths(tp1, tp2, CompareOptions(mode="tolerance", rtol=1e-4, atol=1e-6))
    assert [f.message for f in result.findings] == []
    statuses = {p.name: p.status for p in result.pairs}
    assert statuses["output"] in ("equal", "close") and statuses["output_grad"] in ("equal", "close")
