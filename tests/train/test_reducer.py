"""Exact reduction: the same bits for any alive set and any grouping, over real gloo groups.

Three spawned processes play cells 1, 4 and 7; each scenario is a different alive set, run
over a real ``CrossCellLink`` (ProcessGroupGloo on a PrefixStore of a loopback TCPStore the
test hosts, like the driver does). Each process writes its reduced gradient to a .npy file.
"""

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ftkit.train.rank.crosscell import CrossCellLink
from ftkit.train.rank.reducer import ZERO_EXPONENT, ExactReducer, GradLayout, reduce_float
from ftkit.train.rl.microshards import assign

M = 6
LAYOUT = GradLayout.of([("w", (5, 3)), ("b", (7,)), ("zero", (2, 2)), ("tiny", (3,))])
CELLS = [1, 4, 7]
# (name, alive, reverse local rows, micro-shard holding a NaN)
SCENARIOS = [
    ("one", [4], False, None),
    ("two", [1, 7], False, None),
    ("three", [1, 4, 7], False, None),
    ("three_reversed", [7, 4, 1], True, None),
    ("nan", [1, 4], False, 4),
]


def shard_grad(m: int, nan_shard=None) -> torch.Tensor:
    """Micro-shard m's gradient row: mixed magnitudes, a zero tensor, a subnormal-ish tensor."""
    g = torch.Generator().manual_seed(1000 + m)
    row = torch.randn(LAYOUT.numel, generator=g, dtype=torch.float32)
    mags = torch.pow(10.0, torch.empty(LAYOUT.numel).uniform_(-6, 3, generator=g))
    row = row * mags
    views = LAYOUT.unflatten(row)
    views["zero"].zero_()
    views["tiny"].mul_(1e-30)
    if m == nan_shard:
        row[2] = float("nan")
    return row


def _cell_proc(index: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    cell = CELLS[index]
    store = dist.TCPStore("127.0.0.1", port, is_master=False)
    for epoch, (name, alive, reverse, nan_shard) in enumerate(SCENARIOS):
        if cell not in alive:
            continue
        group = CrossCellLink(store, rank=0, cell=cell)
        group.configure(epoch, alive)
        mine = assign(M, alive)[cell]
        if reverse:
            mine = mine[::-1]
        shards = torch.stack([shard_grad(m, nan_shard) for m in mine])
        side = torch.zeros(M, dtype=torch.float64)
        side[mine] = torch.tensor([-(m + 1) / 3.0 for m in mine], dtype=torch.float64)
        out = ExactReducer(LAYOUT, M).reduce(shards.clone(), group.allreduce, side=side)
        result = np.array([]) if out is None else out.numpy()
        np.save(f"{out_dir}/{name}_cell{cell}.npy", result)
        np.save(f"{out_dir}/{name}_side_cell{cell}.npy", side.numpy())
        fl = reduce_float(shards.clone(), group.allreduce)
        np.save(f"{out_dir}/{name}_float_cell{cell}.npy", np.array([]) if fl is None else fl.numpy())


@pytest.fixture(scope="module")
def reduced(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("reduce")
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    mp.start_processes(_cell_proc, args=(store.port, str(out_dir)), nprocs=len(CELLS), start_method="spawn", join=True)
    return out_dir


def _load(out_dir, name, cell):
    return np.load(out_dir / f"{name}_cell{cell}.npy")


def test_exact_reduction_is_bitwise_identical_for_any_alive_set_and_order(reduced):
    ref = _load(reduced, "one", 4)
    assert ref.shape == (LAYOUT.numel,) and ref.dtype == np.float32
    for name, alive, _, nan_shard in SCENARIOS:
        if nan_shard is not None:
            continue
        for cell in alive:
            got = _load(reduced, name, cell)
            assert got.tobytes() == ref.tobytes(), f"{name} on cell {cell} differs from one cell"


def test_side_values_ride_the_integer_sum_bit_exactly(reduced):
    expected = np.array([-(m + 1) / 3.0 for m in range(M)])
    for name, alive, _, nan_shard in SCENARIOS:
        for cell in alive:
            side = np.load(reduced / f"{name}_side_cell{cell}.npy")
            if nan_shard is None:
                assert side.tobytes() == expected.tobytes(), (name, cell)
            else:  # a refused step leaves the side vector as the cell filled it
                assert np.count_nonzero(side) == len(assign(M, alive)[cell])


def test_exact_reduction_equals_the_true_sum_to_float32_rounding(reduced):
    exact = sum(shard_grad(m).double() for m in range(M))
    got = torch.from_numpy(_load(reduced, "three", 1)).double()
    views = LAYOUT.unflatten(got)
    assert torch.count_nonzero(views["zero"]) == 0
    assert torch.count_nonzero(views["tiny"]) == 3  # tiny magnitudes survive the scale
    assert torch.allclose(got, exact, rtol=1e-6, atol=0)


def test_a_nonfinite_gradient_is_refused_by_every_cell_together(reduced):
    for cell in (1, 4):
        assert _load(reduced, "nan", cell).size == 0  # None: the step is discarded
        assert np.load(reduced / f"nan_float_cell{cell}.npy").size == 0


def test_float_reduction_is_the_float_sum(reduced):
    exact = sum(shard_grad(m).double() for m in range(M))
    for cell in (1, 4, 7):
        got = torch.from_numpy(np.load(reduced / f"three_float_cell{cell}.npy")).double()
        assert torch.allclose(got, exact, rtol=1e-5, atol=1e-12)


def test_exact_reducer_single_process_identity_group_matches_local_sum():
    shards = torch.stack([shard_grad(m) for m in range(M)])
    out = ExactReducer(LAYOUT, M).reduce(shards.clone(), lambda t, op: None)
    exact = shards.double().sum(0)
    assert torch.allclose(out.double(), exact, rtol=1e-6, atol=0)


def test_exact_reducer_refuses_a_float32_overflow_of_the_sum():
    shards = torch.full((2, LAYOUT.numel), 3.0e38, dtype=torch.float32)
    assert ExactReducer(LAYOUT, 2).reduce(shards, lambda t, op: None) is None


def _kernel_rows(k: int, layout: GradLayout) -> torch.Tensor:
    """k rows over ``layout`` with magnitudes from 1e-38 to 1e30 per tensor and ties at .5."""
    g = torch.Generator().manual_seed(77 + k)
    rows = torch.randn(k, layout.numel, generator=g)
    views = [layout.unflatten(r) for r in rows]
    for j, name in enumerate(layout.names):
        mag = 10.0 ** [-38, -20, -6, 0, 3, 30][j % 6]
        for v in views:
            v[name].mul_(mag)
    return rows


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_numpy_and_fused_kernels_give_the_same_bits(k):
    """The fused kernels (``exact_kernels``, what CUDA runs; compiled once, for every k) and the
    numpy ones give the same bits, and neither writes the rows: small tensors sharing a window,
    one spanning several windows, an all-zero one, an empty one, subnormal gradients, ties."""
    from ftkit.train.rank.reducer import WINDOW

    shapes = [(f"t{i}", (3, 7)) for i in range(8)] + [("big", (3 * WINDOW + 5,)), ("zero", (4,)), ("last", (9,))]
    layout = GradLayout.of([*shapes[:3], ("empty", (0,)), ("sub", (64,)), *shapes[3:]])
    rows = _kernel_rows(k, layout)
    for i, row in enumerate(rows):
        named = layout.unflatten(row)
        named["zero"].zero_()
        # subnormal values, a few quanta of 2**-127 each
        named["sub"].copy_(torch.randn(64, generator=torch.Generator().manual_seed(i)) * 3e-39)
        # the tensor's top 3.5 * 2**-60 sets its scale to 2**107 (M = 8): the others become ties
        named["t5"][0, :4] = torch.tensor([0.5, 1.5, -2.5, 3.5 * 2.0**47]) * 2.0**-107
    side = torch.arange(M, dtype=torch.float64) - 2.5
    outs = []
    for numpy_kernels in (True, False):
        red = ExactReducer(layout, 8, numpy_kernels=numpy_kernels)
        s = side.clone()
        src = rows.clone()
        outs.append((red.reduce(src, lambda t, op: None, side=s).clone(), s))
        assert src.numpy().tobytes() == rows.numpy().tobytes()  # both kernel sets only read the rows
    (a, sa), (b, sb) = outs
    assert a.numpy().tobytes() == b.numpy().tobytes()
    assert sa.numpy().tobytes() == sb.numpy().tobytes() == side.numpy().tobytes()
    exact = layout.unflatten(rows.double().sum(0))
    got = layout.unflatten(a.double())
    # ties round half to even in every row: 0.5 -> 0, 1.5 -> 2, -2.5 -> -2 quanta of 2**-107
    assert got["t5"][0, :3].tolist() == [0.0, 2 * k * 2.0**-107, -2 * k * 2.0**-107]
    got["t5"][0, :3] = exact["t5"][0, :3]
    # the 1e-38 tensors sit below the clamped scale: quantised at 2**-127 absolute per row
    for name in layout.names:
        assert torch.allclose(got[name], exact[name], rtol=1e-6, atol=k * 2.0**-127), name
    assert torch.count_nonzero(got["zero"]) == 0


def test_warmed_up_fused_kernels_never_compile_in_a_step():
    """After ``warm_up`` (what a CUDA rank runs when it starts), reductions of any micro-shard
    count, with and without the side vector, compile nothing more: no step waits for the
    compiler (a late cell would miss its peers' collectives)."""
    from torch._dynamo.utils import counters

    from ftkit.train.rank.exact_kernels import warm_up

    warm_up(torch.device("cpu"))
    compiled = counters["stats"]["unique_graphs"]
    layout = GradLayout.of([("a", (3, 5)), ("b", (1000,))])
    for k in (1, 2, 4, 7):
        red = ExactReducer(layout, 8, numpy_kernels=False)
        rows = _kernel_rows(k, layout)
        red.reduce(rows, lambda t, op: None)
        red.reduce(rows, lambda t, op: None, side=torch.zeros(M, dtype=torch.float64))
    assert counters["stats"]["unique_graphs"] == compiled


@pytest.mark.parametrize("numpy_kernels", [True, False])
@pytest.mark.parametrize("bad", [float("nan"), float("-inf")])
def test_both_kernel_sets_see_a_nonfinite_value_in_any_window(numpy_kernels, bad):
    from ftkit.train.rank.reducer import WINDOW

    layout = GradLayout.of([("a", (5,)), ("empty", (0,)), ("big", (2 * WINDOW + 3,))])
    rows = torch.ones(2, layout.numel)
    rows[1, -2] = bad
    red = ExactReducer(layout, 2, numpy_kernels=numpy_kernels)
    exps, finite = red.exponents(rows)
    assert not finite and exps[:2] == [1, ZERO_EXPONENT]
    assert red.reduce(rows, lambda t, op: None) is None


@pytest.mark.parametrize("k", [1, 3])
def test_chunked_integer_collectives_give_the_same_bits(monkeypatch, k):
    """The CPU kernels all-reduce the integer sums a chunk at a time (the side vector in the
    last chunk): the same bits as the torch kernels' one collective, under a fake all-reduce
    that is not the identity (every buffer doubled, as two identical cells would give), with
    each collective a chunk's size."""
    from ftkit.train.rank import reducer
    from ftkit.train.rank.reducer import WINDOW

    monkeypatch.setattr(reducer, "CHUNK", 2 * WINDOW)  # several chunks of two windows
    layout = GradLayout.of([(f"t{i}", (3, 7)) for i in range(5)] + [("big", (5 * WINDOW + 11,)), ("tail", (13,))])
    rows = _kernel_rows(k, layout)
    side = torch.arange(M, dtype=torch.float64) - 2.5
    results, sizes = [], []
    for numpy_kernels in (True, False):
        seen: list[int] = []

        def doubled(t, op, seen=seen):
            if t.dtype == torch.int64 and op == "sum":
                seen.append(t.numel())
                t.mul_(2)

        red = ExactReducer(layout, 8, numpy_kernels=numpy_kernels)
        s = side.clone()
        results.append((red.reduce(rows.clone(), doubled, side=s).clone(), s))
        sizes.append(seen)
    (a, sa), (b, sb) = results
    assert a.numpy().tobytes() == b.numpy().tobytes() and sa.numpy().tobytes() == sb.numpy().tobytes()
    chunked, whole = sizes
    assert whole == [layout.numel + M] and len(chunked) == 3  # 164 k elements in chunks of 2 windows
    assert sum(chunked) == layout.numel + M and max(chunked) <= 2 * WINDOW + M
    assert torch.allclose(a.double(), 2 * rows.double().sum(0), rtol=1e-6, atol=2 * k * 2.0**-127)
