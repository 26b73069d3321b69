"""Rollout prompt selection (a function of seed and rollout) and joined sequences with masks."""

import numpy as np
import pytest

from ftkit.tasks.batching import join, pad_prompts, pad_responses
from ftkit.tasks.sampling import epoch_order, rollout_indices


def test_each_epoch_uses_every_prompt_once_and_rollouts_tile_the_epochs():
    n, k = 12, 4
    drawn = [i for r in range(6) for i in rollout_indices(n, k, seed=3, rollout=r)]
    assert sorted(drawn[:12]) == list(range(12)) and sorted(drawn[12:]) == list(range(12))
    assert drawn[:12] != drawn[12:]  # another epoch, another order
    assert drawn[:12] == list(epoch_order(n, 3, 0))


def test_selection_depends_on_seed_and_rollout_only():
    first = rollout_indices(4000, 16, seed=0, rollout=7)
    epoch_order.cache_clear()  # recomputed from nothing: the same
    assert rollout_indices(4000, 16, seed=0, rollout=7) == first
    assert rollout_indices(4000, 16, seed=1, rollout=7) != first
    assert rollout_indices(4000, 16, seed=0, rollout=8) != first
    # pinned: the order is blake2b's, the same on every machine and Python version
    assert rollout_indices(10, 4, seed=0, rollout=0) == [8, 5, 3, 6]
    with pytest.raises(ValueError):
        rollout_indices(0, 4, seed=0, rollout=0)


def test_join_gives_the_rollout_layout_masks_and_positions_that_skip_left_padding():
    prompts = pad_prompts([[7, 8], [9]], 3, pad_id=0)
    responses = pad_responses([[5, 2], [6]], 3, pad_id=0)
    seq = join(prompts, responses)
    np.testing.assert_array_equal(seq.tokens, [[0, 7, 8, 5, 2, 0], [0, 0, 9, 6, 0, 0]])
    np.testing.assert_array_equal(seq.attention_mask, [[0, 1, 1, 1, 1, 0], [0, 0, 1, 1, 0, 0]])
    # the first real token is position 0 whatever the padding before it
    np.testing.assert_array_equal(seq.position_ids[0, 1:5], [0, 1, 2, 3])
    np.testing.assert_array_equal(seq.position_ids[1, 2:4], [0, 1])
    # position t is learned where token t+1 is a response token
    np.testing.assert_array_equal(seq.loss_mask, [[0, 0, 1, 1, 0, 0], [0, 0, 1, 0, 0, 0]])
    assert seq.loss_mask.dtype == np.float32
    for i, t in zip(*np.nonzero(seq.loss_mask)):
        assert seq.tokens[i, t + 1] in (5, 2, 6)
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        join(prompts, pad_responses([[1]], 3, 0))
