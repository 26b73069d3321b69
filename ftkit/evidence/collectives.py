"""The few collectives the evidence API needs, over ``torch.distributed`` when it is initialized.

Without an initialized process group (a single process) every function acts on one rank.
Values cross ranks as JSON bytes in uint8 tensors (never pickled): ``gather_json`` all-gathers
one JSON-able value per rank, ``broadcast_json`` sends rank 0's to everyone. Every rank of the
group must call them in the same order (they are collectives). The backend's device is used
for the tensors (``cuda`` under NCCL), so the calls work with gloo and NCCL alike.
"""

from __future__ import annotations

import json
from typing import Any


def rank_and_world() -> tuple[int, int]:
    """``(rank, world size)`` of the default process group; ``(0, 1)`` when there is none."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _device() -> Any:
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def gather_json(value: Any) -> list[Any]:
    """Every rank's ``value`` (JSON-able), in rank order, on every rank."""
    import torch
    import torch.distributed as dist

    if rank_and_world()[1] == 1:
        return [json.loads(json.dumps(value))]
    device = _device()
    data = torch.tensor(list(json.dumps(value, separators=(",", ":")).encode()), dtype=torch.uint8, device=device)
    size = torch.tensor([data.numel()], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, size)
    longest = max(int(s.item()) for s in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: data.numel()] = data
    parts = [torch.zeros_like(padded) for _ in sizes]
    dist.all_gather(parts, padded)
    return [json.loads(bytes(p[: int(s.item())].cpu().tolist())) for p, s in zip(parts, sizes)]


def broadcast_json(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (the others pass anything, ``None``)."""
    return gather_json(value if rank_and_world()[0] == 0 else None)[0]
