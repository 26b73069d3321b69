"""The built-in addition task: fixed shapes, seeded prompts, the verifiable reward."""

import pytest
import torch

from ftkit.model.presets import PRESETS
from ftkit.tasks.addition import (
    ANSWER_LEN,
    BOS,
    DIGIT0,
    EOS,
    EQUALS,
    PLUS,
    PROMPT_LEN,
    RESPONSE_TOKENS,
    VOCAB_SIZE,
    AdditionTask,
)


def test_prompts_are_well_formed_and_seeded():
    task = AdditionTask(response_len=8)
    p = task.prompts(seed=3, rollout=1, count=64)
    assert p.shape == (64, PROMPT_LEN) and p.dtype == torch.int64
    assert (p[:, 0] == BOS).all() and (p[:, 2] == PLUS).all() and (p[:, 4] == EQUALS).all()
    digits = p[:, [1, 3]] - DIGIT0
    assert digits.min() >= 0 and digits.max() <= 9
    assert torch.equal(p, task.prompts(seed=3, rollout=1, count=64))
    assert not torch.equal(p, task.prompts(seed=3, rollout=2, count=64))
    assert not torch.equal(p, task.prompts(seed=4, rollout=1, count=64))


def test_answers_and_reward_give_partial_credit():
    task = AdditionTask(response_len=4)
    prompts = torch.tensor([[BOS, DIGIT0 + 3, PLUS, DIGIT0 + 4, EQUALS], [BOS, DIGIT0 + 9, PLUS, DIGIT0 + 8, EQUALS]])
    assert task.answers(prompts).tolist() == [[DIGIT0, DIGIT0 + 7, EOS], [DIGIT0 + 1, DIGIT0 + 7, EOS]]
    right = torch.tensor([[DIGIT0, DIGIT0 + 7, EOS, DIGIT0 + 5], [DIGIT0 + 1, DIGIT0 + 7, EOS, EOS]])
    assert task.reward(prompts, right).tolist() == [1.0, 1.0]  # after <eos> is not scored
    partly = torch.tensor([[DIGIT0, DIGIT0 + 2, EOS, EOS], [DIGIT0 + 1, EOS, DIGIT0, EOS]])
    assert task.reward(prompts, partly).tolist() == pytest.approx([2 / 3, 1 / 3])
    assert task.reward(prompts, torch.full((2, 4), DIGIT0 + 9)).tolist() == [0.0, 0.0]
    assert task.decode(torch.cat([prompts[0], right[0, :3]])) == "<bos>3+4=07<eos>"


def test_vocabulary_fits_every_preset_and_response_len_is_checked():
    assert VOCAB_SIZE < 64 and all(p.vocab_size >= VOCAB_SIZE for p in PRESETS.values())
    assert set(RESPONSE_TOKENS) == {EOS, *range(DIGIT0, DIGIT0 + 10)}
    assert AdditionTask(response_len=6).seq_len == PROMPT_LEN + 6
    with pytest.raises(ValueError, match="at least"):
        AdditionTask(response_len=ANSWER_LEN - 1)


def test_heldout_prompts_are_a_fixed_distinct_seeded_set():
    task = AdditionTask(response_len=4)
    p = task.heldout_prompts(seed=3)
    assert p.shape == (32, PROMPT_LEN) and p.dtype == torch.int64
    assert (p[:, 0] == BOS).all() and (p[:, 2] == PLUS).all() and (p[:, 4] == EQUALS).all()
    assert len({tuple(r) for r in p.tolist()}) == 32  # distinct prompts
    assert torch.equal(p, task.heldout_prompts(seed=3))  # fixed for the run
    assert not torch.equal(p, task.heldout_prompts(seed=4))  # derived from the seed
    assert not torch.equal(p, task.prompts(seed=3, rollout=0, count=32))  # not a rollout's batch
    assert len({tuple(r) for r in task.heldout_prompts(seed=3, count=100).tolist()}) == 100
    with pytest.raises(ValueError, match="1 to 100"):
        task.heldout_prompts(seed=3, count=101)
