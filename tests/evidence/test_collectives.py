"""The evidence API's collectives under a real 2-rank gloo group: JSON gathers and the id gather,
whose capacity grows alike on every rank when a list does not fit. Slow: spawns two processes."""

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
    small = ids.wait(ids.start([rank, 10 + rank]))
    big = ids.wait(ids.start(list(range(100 * rank, 100 * rank + 3 + 50 * rank))))  # rank 1: 53 ids
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
