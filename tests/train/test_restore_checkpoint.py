"""``RankWorker.restore_checkpoint`` without Ray: a real megatron rank in a spawned process.

The rank trains steps 0-1, its state goes through a real checkpoint (``Publisher`` with the
rank's ``write_checkpoint`` as its stage writer, as ``ftkit train``'s driver publishes, its groups
sharded into 64 KiB files -> ``restore.load``; the same as the ``Payload`` of
``checkpoint_state`` published in this process, and a write error rejects it),
it trains step 2, then the checkpoint is restored into it: its fingerprint is the manifest's
again, and step 2 trained once more commits the same state as the first time. A checkpoint
whose manifest fingerprint or counters do not match what the rank ends up holding is refused
(``ValueError``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
from cellrun import synthetic_batch

pytestmark = pytest.mark.slow


def _proc(index: int, run_dir: str, port: int) -> None:
    from ftkit.checkpoint.guard import GuardVerdict
    from ftkit.checkpoint.preflight import agree, preflight
    from ftkit.checkpoint.publish import Outcome, Publisher, Staged
    from ftkit.checkpoint.restore import state_payload
    from ftkit.checkpoint.retention import RetentionPolicy
    from ftkit.tensors.untrusted import load_json
    from ftkit.train.config import TrainConfig
    from ftkit.train.plan.run_plan import build_plan
    from ftkit.train.rank.step_types import StepTask
    from ftkit.train.rank.worker import RankWorker
    from ftkit.train.recovery.resume import read_checkpoint

    cfg = TrainConfig(cells=1, samples_per_rollout=36, steps_per_rollout=3, micro_shards=6, group_size=4, seed=7)
    batch = synthetic_batch(cfg)
    w = RankWorker(build_plan(cfg), run_dir, 0, 0, 0)
    w.init_cell("127.0.0.1", port)
    w.configure(0, [0])
    shards = tuple(range(cfg.batch.micro_shards))

    def train(step: int) -> str:
        w.compute_reduce(StepTask(0, step, 0, 0, shards), batch)
        return str(w.commit(step, 0).total)

    out: dict[str, object] = {"first": [train(0), train(1)]}
    state = w.checkpoint_state()
    payload = state_payload(state["params"], state["optimizer"], state["extra"], {}, state["rank_totals"])
    ck = Path(run_dir) / "checkpoints"
    guard = GuardVerdict(0, 1, False)
    verdict = agree([preflight(ck, 1, payload.nbytes, guard, "cell0-rank0")])
    # shards of 64 KiB: the model's state goes through many files and comes back whole

    def publish(where: Path, what: object) -> Outcome:
        return Publisher(where, RetentionPolicy(), shard_bytes=64 << 10).publish(
            1, what, guard, verdict, metric=0.5, rollout=0
        )

    def rank_writes(stage: Path) -> Staged:
        staged = w.write_checkpoint(str(stage), 1, {}, 64 << 10)
        assert isinstance(staged, Staged), staged
        return staged

    published = publish(ck, rank_writes)
    assert published.published, published.reason
    in_process = publish(Path(run_dir) / "in_process", payload)
    manifests = [load_json((o.path / "MANIFEST.json").read_bytes()) for o in (published, in_process)]
    for m in manifests:  # meta.json differs: the rank adds every rank's spec (``ranks``)
        del m["created"], m["files"]["meta.json"]
    out["same_manifest"] = manifests
    out["ranks"] = sorted(load_json((published.path / "meta.json").read_bytes())["ranks"])
    failure = w.write_checkpoint(str(Path(run_dir) / "no-such-dir"), 1, {}, 64 << 10)
    out["failure"] = [type(failure).__name__, failure.errno]

    def fails(stage: Path) -> Staged:
        raise failure.error()

    out["rejected"] = publish(Path(run_dir) / "rejected", fails).reason
    out["files"] = sorted(p.name for p in published.path.glob("*.safetensors"))
    out["step2"] = train(2)
    ckpt = read_checkpoint(published.path)
    out["manifest"] = ckpt.state_fingerprint
    out["restored"] = w.restore_checkpoint(ckpt.files, ckpt.meta)
    out["counters"] = dict(w.counters)
    out["step2_again"] = train(2)
    for name, meta in (
        ("wrong_fingerprint", {**ckpt.meta, "state_fingerprint": "0" * 32}),
        ("wrong_counters", {**ckpt.meta, "step": 5}),
    ):
        try:
            w.restore_checkpoint(ckpt.files, meta)
            out[name] = "accepted"
        except ValueError as exc:
            out[name] = str(exc)
    w.shutdown()
    (Path(run_dir) / "out.json").write_text(json.dumps(out))


def test_restore_checkpoint_reloads_the_state_bitwise(tmp_path: Path) -> None:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    mp.start_processes(_proc, args=(str(tmp_path), store.port), nprocs=1, start_method="spawn", join=True)
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["restored"] == out["manifest"] == out["first"][1]
    rank_written, in_process = out["same_manifest"]
    assert rank_written == in_process and rank_written["state_fingerprint"] == out["manifest"]
    assert out["ranks"] == ["0"]
    assert out["failure"] == ["WriteFailure", 2]
    assert out["rejected"].startswith("I/O error: [Errno 2]") and "no-such-dir" in out["rejected"]
    assert "optimizer-00001-of-" in " ".join(out["files"]) and "model-00002-of-" in " ".join(out["files"])
    assert out["counters"] == {"step": 1, "rollout": 0}
    assert out["step2_again"] == out["step2"]
    assert "differs from the expected" in out["wrong_fingerprint"]
    assert "disagree with its manifest" in out["wrong_counters"]
