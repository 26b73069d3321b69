"""Cross-cell communication of one rank position: the group over the alive cells of an epoch.

Every rank position (tp, pp) of every live cell is a member of one ``CrossCellLink``. Its
group lives outside the cell's own torch.distributed world (``new_group`` cannot make it):
it is built directly on ``PrefixStore(f"xcell/e{epoch}/r{rank}", store)`` of the driver's
TCPStore, so each epoch has its own fresh key space and a group of a dead epoch can never be
joined by mistake. Its backend is the run's ``Placement.link`` (``ftkit.train.plan.placement``):

* ``gloo`` on CPU;
* ``nccl`` on CUDA when every rank has a GPU of its own (a host tensor goes through the device);
* ``gloo-host`` on CUDA when cells share GPUs (NCCL refuses two ranks of one communicator on one
  device): a device tensor is copied to a pinned host buffer (non-blocking, then the stream is
  synchronised), reduced by gloo there and copied back (non-blocking, stream-ordered before any
  later use of the tensor or the buffer); a host tensor is reduced in place. The exact
  reduction's int64 sum is the same bits over any backend; the buffer is reused per shape.

Contract:

* ``configure(epoch, alive)`` builds the group of ``epoch`` over the sorted set ``alive``
  (this cell must be in it). Collective over the members: each calls it with the same
  arguments, and it returns once all of them joined (bounded by ``timeout_s``). The previous
  group is abandoned first (``abort``).
* ``allreduce(tensor, op)`` reduces in place across the members; any failure of the
  collective (a peer that died, closed its socket or did not answer within ``timeout_s``)
  raises ``CollectiveError``: the caller's step is then discarded and the driver
  reconfigures. The group is unusable afterwards until the next ``configure``.
* ``abort()`` drops the group (idempotent); nothing is reused across epochs.

``timeout_s`` is ``--collective-timeout``: how long a member waits for a peer in a collective
or in the rendezvous before declaring it gone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor
    from torch.distributed import Store


class CollectiveError(RuntimeError):
    """A cross-cell collective failed or timed out (a peer is dead, hung or unreachable)."""


class CrossCellLink:
    """This rank position's membership in the cross-cell group (see the module docstring)."""

    def __init__(self, store: Store, rank: int, cell: int, backend: str = "gloo", timeout_s: float = 300.0) -> None:
        if backend not in ("gloo", "nccl", "gloo-host"):
            raise ValueError(f"cross-cell backend {backend!r} (gloo, nccl, gloo-host)")
        self.store, self.rank, self.cell = store, int(rank), int(cell)
        self.backend, self.timeout_s = backend, float(timeout_s)
        self.epoch: int | None = None
        self.members: list[int] = []
        self.pg: Any = None
        self._buffers: dict[tuple[Any, ...], Tensor] = {}  # gloo-host: pinned staging per shape

    def configure(self, epoch: int, alive: Sequence[int]) -> None:
        """Join the group of ``epoch`` over ``alive`` (see the module docstring)."""
        import datetime

        import torch.distributed as dist

        members = sorted(set(int(c) for c in alive))
        if self.cell not in members:
            raise ValueError(f"cell {self.cell} is not in the alive set {members}")
        self.abort()
        prefixed = dist.PrefixStore(f"xcell/e{int(epoch)}/r{self.rank}", self.store)
        timeout = datetime.timedelta(seconds=self.timeout_s)
        try:
            if self.backend == "nccl":
                opts = dist.ProcessGroupNCCL.Options()
                opts._timeout = timeout
                self.pg = dist.ProcessGroupNCCL(prefixed, members.index(self.cell), len(members), opts)
            else:
                self.pg = dist.ProcessGroupGloo(prefixed, members.index(self.cell), len(members), timeout)
        except Exception as exc:  # noqa: BLE001 - any rendezvous failure means a member is missing
            raise CollectiveError(f"epoch {epoch}: cannot join the group of cells {members}: {exc}") from exc
        self.epoch, self.members = int(epoch), members

    def allreduce(self, tensor: Tensor, op: str) -> None:
        """In-place all-reduce of ``tensor`` with ``op`` ("sum" or "max") across the members."""
        import torch.distributed as dist

        if self.pg is None:
            raise CollectiveError(f"cell {self.cell} rank {self.rank} has no cross-cell group (call configure)")
        opts: Any = dist.AllreduceOptions()
        opts.reduceOp = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op]
        try:
            if self.backend == "nccl" and not tensor.is_cuda:  # NCCL needs device memory
                dev = tensor.cuda()
                self.pg.allreduce([dev], opts).wait()
                tensor.copy_(dev.cpu())
            elif self.backend == "gloo-host" and tensor.device.type != "cpu":
                self._host_allreduce(tensor, opts)
            else:
                self.pg.allreduce([tensor], opts).wait()
        except Exception as exc:  # noqa: BLE001 - gloo/NCCL raise RuntimeError subclasses of many kinds
            self.pg = None
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise CollectiveError(f"epoch {self.epoch} all-reduce failed: {first}") from None

    def _host_allreduce(self, tensor: Tensor, opts: Any) -> None:
        """gloo-host: ``tensor`` (on a device) through its pinned host buffer (module docstring)."""
        import torch

        key = (tuple(tensor.shape), tensor.dtype)
        host = self._buffers.get(key)
        if host is None:
            host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=torch.cuda.is_available())
            self._buffers[key] = host
        host.copy_(tensor, non_blocking=True)
        if tensor.is_cuda:
            torch.cuda.current_stream(tensor.device).synchronize()  # the host copy is complete
        self.pg.allreduce([host], opts).wait()
        tensor.copy_(host, non_blocking=True)  # stream-ordered before the next use of either

    def abort(self) -> None:
        """Drop the current group (idempotent)."""
        pg, self.pg = self.pg, None
        if pg is not None and self.backend == "nccl":
            import contextlib

            with contextlib.suppress(Exception):  # aborting a broken communicator may itself fail
                pg.abort()
