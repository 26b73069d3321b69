"""The non-finite guard: records since the last boundary, consumed exactly once, merged across ranks."""

from __future__ import annotations

import math

import pytest

from ftkit.checkpoint.guard import MAX_REASONS, GuardError, GuardVerdict, NonFiniteGuard, merge


def test_clean_interval_and_reset_only_on_consume() -> None:
    g = NonFiniteGuard()
    for step in range(4):
        g.observe_value(step, "loss", 1.0)
        g.observe(step, "reduced gradient", True)
    assert not g.tainted
    v = g.consume(3)
    assert v == GuardVerdict(0, 3, False, 0, ())
    assert g.from_step == 4


def test_nonfinite_taints_until_consumed_even_if_step_discarded() -> None:
    g = NonFiniteGuard()
    g.observe(5, "local gradient decoder.w", False)
    g.observe_value(6, "loss", math.nan)
    g.observe_value(6, "loss", 2.0)
    assert g.tainted  # reading does not consume
    assert g.tainted
    v = g.consume(7)
    assert v.tainted and v.count == 2 and v.from_step == 0 and v.to_step == 7
    assert v.reasons == ("step 5: local gradient decoder.w", "step 6: loss")
    nxt = g.consume(11)  # the next interval starts clean
    assert not nxt.tainted and (nxt.from_step, nxt.to_step) == (8, 11)


def test_boundary_cannot_be_consumed_twice() -> None:
    g = NonFiniteGuard(first_step=12)
    g.consume(15)
    with pytest.raises(GuardError):
        g.consume(14)
    empty = g.consume(15)  # an empty interval (no step since) is allowed
    assert (empty.from_step, empty.to_step, empty.tainted) == (16, 15, False)


def test_reasons_bounded_count_exact() -> None:
    g = NonFiniteGuard()
    for i in range(50):
        g.observe_value(i, "loss", math.inf)
    v = g.consume(49)
    assert v.count == 50 and len(v.reasons) == MAX_REASONS


def test_merge_widest_interval_any_taint() -> None:
    a = GuardVerdict(0, 7, False)
    b = GuardVerdict(4, 7, True, 1, ("step 5: loss",))  # a healed rank: shorter interval
    m = merge([a, b])
    assert (m.from_step, m.to_step, m.tainted, m.count, m.reasons) == (0, 7, True, 1, ("step 5: loss",))
    assert not merge([a, a]).tainted
    with pytest.raises(ValueError):
        merge([a, GuardVerdict(0, 8, False)])
    with pytest.raises(ValueError):
        merge([])
