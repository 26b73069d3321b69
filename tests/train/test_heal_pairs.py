"""Which donor heals which recipient (``Healer._pair``): different donors in parallel."""

from ftkit.train.control.healing import Healer


def test_recipients_get_different_donors_while_there_are_donors():
    assert Healer._pair({1: 1, 3: 3}, [0, 2]) == {1: 2, 3: 0}
    pairs = Healer._pair({1: 1, 2: 2, 3: 3}, [0, 4])  # three recipients, two donors
    assert len(pairs) == 2 and len(set(pairs.values())) == 2  # the third waits for the next round


def test_a_retry_moves_to_the_next_donor():
    first = Healer._pair({1: 1 + 0}, [0, 2, 3])[1]
    second = Healer._pair({1: 1 + 1}, [0, 2, 3])[1]
    assert first != second
