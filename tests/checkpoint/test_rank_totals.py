"""Checkpoints of cells of several ranks (TP x PP): the canonical state, each rank's shard of it
(``canonical_state.local_state``), and ``verify-checkpoint`` recomputing every rank's total from
the stored tensors (FT202) and requiring every rank's committed fingerprint in the log (FT214).

A TP=2 x PP=2 cell of a 2-layer model, built from plain parameters carrying megatron's
sharding attributes (no process group needed: ``local_state`` is local)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from ckpt_helpers import publish
from test_verify import relist

from ftkit.checkpoint.guard import GuardVerdict
from ftkit.checkpoint.publish import Publisher
from ftkit.checkpoint.restore import state_payload
from ftkit.checkpoint.retention import RetentionPolicy
from ftkit.checkpoint.shards import groups
from ftkit.checkpoint.verify import verify_path
from ftkit.events.writer import EventWriter
from ftkit.tensors.fingerprint import combine, fingerprint
from ftkit.train.rank.canonical_state import local_state, rank_spec

TP, PP, STEP = 2, 2, 3
# canonical name -> (shape, split dim or None, stride)
PARAMS = {
    "embedding.word_embeddings.weight": ((8, 4), 0, 1),
    "decoder.layers.0.self_attention.linear_qkv.weight": ((12, 4), 0, 3),
    "decoder.layers.0.input_layernorm.weight": ((4,), None, 1),
    "decoder.layers.1.self_attention.linear_qkv.weight": ((12, 4), 0, 3),
    "decoder.layers.1.mlp.linear_fc2.weight": ((4, 6), 1, 1),
    "output_layer.weight": ((8, 4), 0, 1),
}
STAGE = {0: ["embedding.", "decoder.layers.0."], 1: ["decoder.layers.1.", "output_layer."]}


def canonical() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(5)
    params = {n: torch.randn(shape, generator=g) for n, (shape, _, _) in PARAMS.items()}
    optim = {
        f"{n}.{k}": torch.randn(t.shape, generator=g) for n, t in params.items() for k in ("exp_avg", "exp_avg_sq")
    }
    optim.update({f"{n}.step": torch.tensor(4.0) for n in params})
    return params, optim


def expected_shard(full: torch.Tensor, dim: int | None, stride: int, tp_rank: int) -> torch.Tensor:
    """Rank ``tp_rank``'s shard, computed independently of ``shard_of`` (chunk, then interleave)."""
    if dim is None:
        return full
    blocks = torch.chunk(full, TP * stride, dim=dim)
    return torch.cat(blocks[tp_rank::TP], dim=dim)


def rank_params(tp_rank: int, pp_rank: int) -> list[tuple[str, torch.nn.Parameter]]:
    """The stage-local ``(name, parameter)`` of a rank, with megatron's sharding attributes."""
    out = []
    for name, (shape, dim, stride) in PARAMS.items():
        if not any(name.startswith(p) for p in STAGE[pp_rank]):
            continue
        local = name.replace("decoder.layers.1.", "decoder.layers.0.") if pp_rank == 1 else name
        p = torch.nn.Parameter(expected_shard(torch.zeros(shape), dim, stride, tp_rank).clone())
        if dim is not None:
            p.tensor_model_parallel, p.partition_dim, p.partition_stride = True, dim, stride
        out.append((local, p))
    return out


RANKS = {tp + TP * pp: (tp, pp) for pp in range(PP) for tp in range(TP)}  # megatron: TP innermost


def rank_total(params: dict[str, torch.Tensor], optim: dict[str, torch.Tensor]) -> str:
    """What a rank logs in ``state_fingerprint`` (``rank_state.fingerprint_state``'s prefixes)."""
    named = {f"param/{n}": fingerprint(t) for n, t in params.items()}
    named.update({f"optimizer/{n}": fingerprint(t) for n, t in optim.items()})
    return combine(named)


def test_local_state_slices_each_rank_exactly_its_shard() -> None:
    params, optim = canonical()
    for tp_rank, pp_rank in RANKS.values():
        named = rank_params(tp_rank, pp_rank)
        mine, mine_optim = local_state(params, optim, named, tp_rank, TP, pp_rank)
        assert sorted(mine) == sorted(n for n, _ in named)
        for local, _ in named:
            canonical_name = local.replace("layers.0.", "layers.1.") if pp_rank == 1 else local
            _, dim, stride = PARAMS[canonical_name]
            assert torch.equal(mine[local], expected_shard(params[canonical_name], dim, stride, tp_rank))
            for k in ("exp_avg", "exp_avg_sq"):
                want = expected_shard(optim[f"{canonical_name}.{k}"], dim, stride, tp_rank)
                assert torch.equal(mine_optim[f"{local}.{k}"], want)
            assert torch.equal(mine_optim[f"{local}.step"], torch.tensor(4.0))
    with pytest.raises(ValueError, match="holds no"):
        local_state({}, optim, rank_params(0, 0), 0, TP, 0)


@pytest.fixture
def run(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A run directory with one checkpoint of a TP=2 x PP=2 cell and every rank's logged total."""
    return publish_run(tmp_path)


def publish_run(tmp_path: Path, shard_bytes: int | None = None) -> tuple[Path, dict[str, str]]:
    """The ``run`` fixture's directory; ``shard_bytes``: the publisher's shard size."""
    params, optim = canonical()
    totals, specs, entries = {}, {}, {}
    for rank, (tp_rank, pp_rank) in RANKS.items():
        named = rank_params(tp_rank, pp_rank)
        mine, mine_optim = local_state(params, optim, named, tp_rank, TP, pp_rank)
        totals[str(rank)] = rank_total(mine, mine_optim)
        entries[str(rank)] = (
            {n: fingerprint(t) for n, t in mine.items()},
            {n: fingerprint(t) for n, t in mine_optim.items()},
        )
        specs[str(rank)] = rank_spec(named, tp_rank, pp_rank, TP, pp_rank)
    meta = {"layout": {"tp": TP, "pp": PP}, "ranks": specs}
    p = state_payload(params, optim, {"counters": torch.tensor([STEP, 1])}, meta, totals)
    run = tmp_path / "run"
    with EventWriter(run / "events", run="run", role="driver") as driver:
        pub = Publisher(
            run / "checkpoints",
            RetentionPolicy(1, 1),
            on_event=lambda t, fields: driver.emit(t, **fields),
            **({"shard_bytes": shard_bytes} if shard_bytes else {}),
        )
        publish(pub, STEP, payload=p, guard=GuardVerdict(0, STEP, False))
    with EventWriter(run / "events", run="run", role="trainer", cell=0, rank=0) as w:
        for rank, total in totals.items():
            w.emit("state_fingerprint", rollout=1, step=STEP, attempt=0, cell=0, rank=int(rank), total=total,
                   params=entries[rank][0], optimizer=entries[rank][1])  # fmt: skip
    return run, totals


def ckpt(run: Path) -> Path:
    return run / "checkpoints" / f"step_{STEP:06d}"


def test_a_tp2_pp2_checkpoint_verifies_with_every_rank_total_recomputed(run) -> None:
    path, totals = run
    res = verify_path(path)
    assert res.findings == [] and len(set(totals.values())) == 4
    assert {r.code: r.checked for r in res.rules}["FT202"] >= 4  # one check per rank total


def test_rank_totals_are_recomputed_across_shard_files(tmp_path) -> None:
    """Model and optimizer state cut into shard files of 100 bytes: every rank's shard of the
    state is sliced out of the right files and every total still checks (and a wrong one fails)."""
    path, totals = publish_run(tmp_path, shard_bytes=100)
    by_group = groups(p.name for p in ckpt(path).iterdir())
    assert len(by_group["model.safetensors"]) >= 3 and len(by_group["optimizer.safetensors"]) >= 6
    assert "model.safetensors" not in by_group["model.safetensors"]
    res = verify_path(path)
    assert res.findings == [] and {r.code: r.checked for r in res.rules}["FT202"] >= 4
    man = json.loads((ckpt(path) / "MANIFEST.json").read_text())
    man["rank_totals"]["1"] = "0" * 32
    (ckpt(path) / "MANIFEST.json").write_text(json.dumps(man))
    assert [f.code for f in verify_path(ckpt(path), events=False).findings] == ["FT202"]


def test_ft202_a_rank_total_that_is_not_its_shard_of_the_stored_state(run) -> None:
    path, _ = run
    man = json.loads((ckpt(path) / "MANIFEST.json").read_text())
    man["rank_totals"]["3"] = "0" * 32
    (ckpt(path) / "MANIFEST.json").write_text(json.dumps(man))
    found = verify_path(ckpt(path), events=False).findings  # the checkpoint alone: retention records its old manifest
    assert [f.code for f in found] == ["FT202"] and "rank 3's shard" in found[0].message


@pytest.mark.parametrize("edit", ["drop", "rank", "name"])
def test_ft202_meta_without_a_usable_rank_spec(run, edit) -> None:
    path, _ = run
    meta_path = ckpt(path) / "meta.json"
    meta = json.loads(meta_path.read_text())
    if edit == "drop":
        del meta["ranks"]
    elif edit == "rank":
        del meta["ranks"]["2"]
    else:
        spec = meta["ranks"]["0"]["params"]
        spec["embedding.word_embeddings.weight"][0] = "no.such.tensor"
    meta_path.write_text(json.dumps(meta))
    relist(ckpt(path))  # a consistent manifest over the edited meta.json: only the rank check can tell
    found = verify_path(ckpt(path), events=False).findings
    assert [f.code for f in found] == ["FT202"] and "cannot be recomputed" in found[0].message


def test_ft214_a_rank_whose_committed_fingerprint_is_not_in_the_log(run) -> None:
    path, totals = run
    for f in (path / "events").glob("*.jsonl"):
        lines = [x for x in f.read_text().splitlines() if '"rank":3,' not in x.replace(" ", "")]
        f.write_text("\n".join(lines) + "\n")
    found = verify_path(path).findings
    assert [f.code for f in found] == ["FT214"] and "rank 3" in found[0].message
