"""The few collectives the evidence API needs, over ``torch.distributed`` when it is initialized.

Without an initialized process group (a single process) every function acts on one rank.
Values cross ranks as JSON bytes in uint8 tensors (never pickled): ``gather_json`` all-gathers
one JSON-able value per rank, ``broadcast_json`` sends rank 0's to everyone. Every rank of the
group must call them in the same order (they are collectives). The backend's device is used
for the tensors (``cuda`` under NCCL), so the calls work with gloo and NCCL alike.

Teardown: gloo runs every collective on its worker threads, and a worker drops its reference to a
finished work (and to the work's tensors) only after the caller's ``wait`` has returned. A tensor
whose Python object is gone by then is freed by the worker, which takes the GIL to do so; if that
happens while the interpreter is finalizing, the worker thread is torn down inside a C++
destructor and the process aborts ("terminate called without an active exception", SIGABRT). So
every function here keeps the tensors of its last collective referenced from Python until its next
one or ``release``, and ``EvidenceRun.close`` ends with ``barrier`` (which gloo runs after every
earlier work) and then ``release``: when ``close`` returns, no work of the evidence API is alive.
"""

from __future__ import annotations

import json
from typing import Any

_held: dict[str, list[Any]] = {}  # the tensors of the last collective of each kind (module docstring)


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
    _held["json"] = [size, *sizes, padded, *parts]
    return [json.loads(bytes(p[: int(s.item())].cpu().tolist())) for p, s in zip(parts, sizes)]


def broadcast_json(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (the others pass anything, ``None``)."""
    return gather_json(value if rank_and_world()[0] == 0 else None)[0]


def barrier() -> None:
    """Return once every rank of the default group has called it (no-op without a group)."""
    import torch.distributed as dist

    if rank_and_world()[1] > 1:
        dist.barrier()


def release() -> None:
    """Drop the tensors kept from the last collectives (after a ``barrier`` that followed them)."""
    _held.clear()


class IdGather:
    """All-gathers every rank's list of ints (the sample ids of a step) in ONE collective per call,
    optionally asynchronous (``start`` returns at once; ``wait`` gives the lists in rank order, as
    int64 tensors).

    Each rank sends ``[n, id_0, ..., id_{n-1}]`` padded to a capacity all ranks hold alike; when a
    rank's list did not fit, every rank sees that from the gathered lengths, grows the capacity the
    same way and gathers again (synchronously), so the ranks never disagree on a size.
    """

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity

    def start(self, ids: list[int]) -> Any:
        """Begin the gather of this rank's ``ids``; returns a handle for ``wait``. Every started
        gather must be waited (on every rank) before the group is destroyed."""
        import torch
        import torch.distributed as dist

        if rank_and_world()[1] == 1:
            return ([list(ids)], None, ids)
        slot = torch.zeros(self.capacity + 1, dtype=torch.int64, device=_device())
        slot[0] = len(ids)
        fit = ids[: self.capacity]
        if fit:
            slot[1 : len(fit) + 1] = torch.tensor(fit, dtype=torch.int64)
        parts = [torch.zeros_like(slot) for _ in range(dist.get_world_size())]
        _held["ids"] = [slot, *parts]  # the previous gather was waited: its worker let go long ago
        return (parts, dist.all_gather(parts, slot, async_op=True), ids)

    def wait(self, handle: Any) -> list[Any]:
        """The lists of every rank, in rank order, as 1-d int64 CPU tensors (collective again only
        when one did not fit)."""
        import torch

        parts, work, ids = handle
        if work is None:
            return [torch.tensor(p, dtype=torch.int64) for p in parts]
        work.wait()
        rows = [p.cpu() for p in parts]
        lengths = [int(n) for n in torch.stack([r[0] for r in rows]).tolist()]
        longest = max(lengths)
        if longest > self.capacity:
            self.capacity = 2 * longest
            return self.wait(self.start(ids))
        return [r[1 : n + 1] for r, n in zip(rows, lengths)]
