"""The cross-cell link: a peer that never answers is a CollectiveError within the timeout, and a
new epoch forms a fresh group under its own prefix. Two link members in threads of this process
over a loopback TCPStore (gloo allows several ranks per process)."""

import threading

import pytest
import torch
import torch.distributed as dist

from ftkit.train.rank.crosscell import CollectiveError, CrossCellLink


def links(timeout_s=2.0):
    """The master store and two links, each on its own client (as in two processes)."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    clients = [dist.TCPStore("127.0.0.1", store.port, is_master=False) for _ in range(2)]
    return store, [CrossCellLink(cl, rank=0, cell=c, timeout_s=timeout_s) for cl, c in zip(clients, (3, 5))]


def together(*calls):
    errors = []

    def run(call):
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors


def test_a_silent_peer_is_a_collective_error_then_a_new_epoch_works():
    _store, (a, b) = links()
    assert not together(lambda: a.configure(0, [3, 5]), lambda: b.configure(0, [5, 3]))
    x = torch.ones(3)
    with pytest.raises(CollectiveError, match="epoch 0 all-reduce failed"):
        a.allreduce(x, "sum")  # cell 5 never joins this collective
    with pytest.raises(CollectiveError, match="no cross-cell group"):
        a.allreduce(x, "sum")  # the broken group is dropped
    assert not together(lambda: a.configure(1, [3, 5]), lambda: b.configure(1, [3, 5]))
    ys = [torch.full((2,), 2.0), torch.full((2,), 5.0)]
    assert not together(lambda: a.allreduce(ys[0], "max"), lambda: b.allreduce(ys[1], "max"))
    assert ys[0].tolist() == ys[1].tolist() == [5.0, 5.0]


def test_a_member_missing_from_the_rendezvous_is_a_collective_error():
    _store, (a, _b) = links()
    with pytest.raises(CollectiveError, match="cannot join"):
        a.configure(0, [3, 5])
    with pytest.raises(ValueError, match="not in the alive set"):
        a.configure(1, [5])


def test_the_link_of_cells_sharing_a_gpu_reduces_to_the_same_bits():
    """Two cells planned on one GPU get the ``gloo-host`` link; the exact reduction over it is the
    same int64 sum, so the same bits as one cell reducing every micro-shard alone (on CPU the
    host staging is the tensor itself; the pinned copies run on CUDA only)."""
    from ftkit.train.plan.placement import plan_placement
    from ftkit.train.rank.reducer import ExactReducer, GradLayout

    backend = plan_placement(2, 1, 1, 1, "cuda", [1]).link
    assert backend == "gloo-host"
    layout = GradLayout.of([("w", (9, 4)), ("b", (5,))])
    g = torch.Generator().manual_seed(3)
    rows = torch.randn(4, layout.numel, generator=g) * torch.logspace(-6, 2, layout.numel)
    alone = ExactReducer(layout, 4).reduce(rows.clone(), lambda t, op: None)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    clients = [dist.TCPStore("127.0.0.1", store.port, is_master=False) for _ in range(2)]
    a, b = (CrossCellLink(cl, rank=0, cell=c, backend=backend, timeout_s=30) for cl, c in zip(clients, (0, 1)))
    assert not together(lambda: a.configure(0, [0, 1]), lambda: b.configure(0, [0, 1]))
    out = {}

    def reduce(link, part, key):
        out[key] = ExactReducer(layout, 4).reduce(rows[part].clone(), link.allreduce)

    assert not together(lambda: reduce(a, slice(0, 2), "a"), lambda: reduce(b, slice(2, 4), "b"))
    assert torch.equal(out["a"].view(torch.int32), alone.view(torch.int32))
    assert torch.equal(out["b"].view(torch.int32), alone.view(torch.int32))


def test_an_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="gloo-host"):
        CrossCellLink(None, rank=0, cell=0, backend="mpi")  # type: ignore[arg-type]
