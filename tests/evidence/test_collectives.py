"""The evidence API's collectives under a real 2-rank gloo group: JSON gathers and the id gather,
whose capacity grows alike on every rank when a list does not fit; ``EvidenceRun.close`` as a
collective that leaves nothing to gloo's threads. Slow: spawns two processes."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")


def _rank(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from ftkit.evidence.collectives import IdGather, broadcast_json, gather_json

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    ids = IdGather(capacity=4)
    small = [t.tolist() for t in ids.wait(ids.start([rank, 10 + rank]))]
    big = [t.tolist() for t in ids.wait(ids.start(list(range(100 * rank, 100 * rank + 3 + 50 * rank))))]  # rank 1: 53
    after = ids.capacity
    doc = {
        "gather": gather_json({"rank": rank, "text": "é" * rank}),
        "bcast": broadcast_json("from rank 0" if rank == 0 else "ignored"),
        "small": small,
        "big": big,
        "capacity": after,
    }
    Path(out, f"{rank}.json").write_text(json.dumps(doc))
    dist.destroy_process_group()


def test_gathers_agree_on_every_rank(tmp_path):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(port, str(tmp_path)), nprocs=2, join=True)
    docs = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    assert docs[0] == docs[1]
    doc = docs[0]
    assert doc["gather"] == [{"rank": 0, "text": ""}, {"rank": 1, "text": "é"}]
    assert doc["bcast"] == "from rank 0"
    assert doc["small"] == [[0, 10], [1, 11]]
    assert doc["big"] == [[0, 1, 2], list(range(100, 153))] and doc["capacity"] == 106


def _closing_rank(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from ftkit.evidence import EvidenceProfile, EvidenceRun, collectives

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    run = EvidenceRun(Path(out) / "run", EvidenceProfile(fingerprint_every=None, metric_every=None))
    run.allocate(0, range(4))
    run.step(0, samples=[2 * rank, 2 * rank + 1])  # its id gather is still in flight when close starts
    run.close()
    lines = (Path(out) / "run" / "events" / "driver-i0.jsonl").read_text().splitlines()
    pending, held = run._pending is not None, sorted(collectives._held)
    doc = {"last": json.loads(lines[-2])["type"], "pending": pending, "held": held}
    Path(out, f"{rank}.json").write_text(json.dumps(doc))
    dist.destroy_process_group()


def test_close_returns_on_every_rank_after_run_finished_with_no_collective_left(tmp_path):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_closing_rank, args=(port, str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):  # rank 1 too: it returned from close only after rank 0 finished the run
        doc = json.loads((tmp_path / f"{rank}.json").read_text())
        assert doc == {"last": "run_finished", "pending": False, "held": []}
