"""``RolloutTally``: an allocation is complete once every id is counted as often as owed (an id
allocated twice is owed twice), whatever else was counted."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ftkit.evidence.tally import RolloutTally  # noqa: E402


def test_complete_only_when_every_id_is_counted_as_often_as_owed():
    tally = RolloutTally([5, 3, 9, 3], expected=1)  # 3 is allocated twice: owed twice
    tally.add(torch.tensor([3, 5, 7, 9]), torch.tensor([1, 1, 4, 1]))  # 7 was never allocated
    assert not tally.complete()
    tally.add([3, 100], [1, 1])
    assert tally.complete()


def test_expected_multiplies_what_each_id_is_owed():
    tally = RolloutTally(range(4), expected=2)
    tally.add(range(4), [1] * 4)
    assert not tally.complete()
    tally.add([0, 1, 2, 3], [1, 1, 1, 1])
    assert tally.complete()


def test_an_empty_allocation_is_complete_and_ignores_every_count():
    tally = RolloutTally([], expected=1)
    tally.add([1, 2], [1, 1])
    assert tally.complete()
