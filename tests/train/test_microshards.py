"""Micro-shard cutting and assignment: fixed by the data, contiguous, partition-free."""

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ftkit.train.rl.microshards import assign, shard_seed, shard_slices


def test_shard_slices_cut_equal_consecutive_ranges():
    assert shard_slices(12, 4) == [slice(0, 3), slice(3, 6), slice(6, 9), slice(9, 12)]


def test_shard_slices_refuses_uneven_cut():
    with pytest.raises(ValueError, match="cannot be cut"):
        shard_slices(10, 4)


@given(m=st.integers(1, 40), alive=st.sets(st.integers(0, 63), min_size=1, max_size=12))
def test_assign_covers_every_shard_once_with_contiguous_ranges(m, alive):
    if m < len(alive):
        with pytest.raises(ValueError):
            assign(m, alive)
        return
    out = assign(m, alive)
    assert sorted(out) == sorted(alive)
    flat = [s for cell in sorted(out) for s in out[cell]]
    assert flat == list(range(m))  # in cell order, each shard once
    sizes = [len(v) for v in out.values()]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_assign_ignores_listing_order_and_duplicates():
    ref = assign(8, [0, 3, 5])
    for perm in itertools.permutations([0, 3, 5, 5]):
        assert assign(8, perm) == ref
    assert ref == {0: [0, 1, 2], 3: [3, 4, 5], 5: [6, 7]}


def test_shard_seed_depends_on_every_coordinate_but_not_on_a_cell():
    base = shard_seed(1, 2, 3, 4)
    assert base == shard_seed(1, 2, 3, 4)
    others = {shard_seed(2, 2, 3, 4), shard_seed(1, 3, 3, 4), shard_seed(1, 2, 4, 4), shard_seed(1, 2, 3, 5)}
    assert base not in others and len(others) == 4
    assert 0 <= base < 2**63
