"""The built-in rewards: exact numeric match, format, and the addition task's two."""

from fractions import Fraction

import pytest
import torch

from ftkit.tasks.addition import AdditionTask
from ftkit.tasks.builtin_rewards import (
    addition_task,
    deterministic_random,
    exact_match,
    extract_answer,
    format_reward,
    last_boxed,
    parse_number,
    random_bit,
)


@pytest.mark.parametrize(
    ("response", "label", "want"),
    [
        ("3 + 4 is 7", "7", 1.0),
        ("first 7, then 8", "7", 0.0),  # the last number counts
        ("I get 12, so \\boxed{15}. Check: 12", "15", 1.0),  # a boxed answer wins over later numbers
        ("\\boxed{1,234}", "1234", 1.0),
        ("\\boxed{\\frac{3}{4}}", "0.75", 1.0),
        ("it is .5", "1/2", 1.0),
        ("it is 0.50.", "0.5", 1.0),
        ("\\boxed{-3}", "-3", 1.0),
        ("\\boxed{3}", "-3", 0.0),
        ("\\boxed{x + 1}", "1", 0.0),  # boxed but not a number
        ("no number here", "1", 0.0),
        ("$42", "42", 1.0),
    ],
)
def test_exact_match(response, label, want):
    assert exact_match(prompt="", response=response, label=label, prompt_ids=[], response_ids=[]) == want


def test_exact_match_refuses_to_guess_without_a_numeric_label():
    with pytest.raises(ValueError, match="needs a label"):
        exact_match(response="1", label=None)
    with pytest.raises(ValueError, match="not a number"):
        exact_match(response="1", label="one")


def test_answer_extraction_helpers():
    assert last_boxed("a \\boxed{1} b \\boxed{{2}+{3}}") == "{2}+{3}"
    assert last_boxed("\\boxed{7} then \\boxed{unclosed") == "7"
    assert last_boxed("none") is None
    assert extract_answer("x 1.5 y -2") == "-2"
    assert parse_number("2/4") == Fraction(1, 2) and parse_number("1,23") is None and parse_number("") is None


@pytest.mark.parametrize(
    ("response", "want"),
    [
        ("so \\boxed{4}", 1.0),
        ("\\boxed{ }", 0.0),
        ("work\nAnswer: 12", 1.0),
        ("work\nfinal answer = 12\n\n", 1.0),
        ("work\n#### 12", 1.0),
        ("Answer: 12\nbut then more text", 0.0),  # the answer line must be the last one
        ("the answer is 12", 0.0),
        ("", 0.0),
    ],
)
def test_format_reward(response, want):
    assert format_reward(prompt="", response=response, label=None) == want


def test_the_addition_rewards_per_sample_equal_the_batch_rewards_of_the_train_core():
    task = AdditionTask(response_len=4)
    prompts = task.prompts(seed=3, rollout=0, count=64)
    answers = task.answers(prompts)
    g = torch.Generator().manual_seed(0)
    responses = torch.cat([answers, torch.full((64, 1), 2)], dim=1)
    responses[::3, :2] = torch.randint(5, 15, (22, 2), generator=g)  # some wrong answers
    batch = task.reward(prompts, responses)
    per_sample = [addition_task(prompt_ids=p.tolist(), response_ids=r.tolist()) for p, r in zip(prompts, responses)]
    assert per_sample == batch.tolist() and len(set(per_sample)) > 1
    bits = [deterministic_random(prompt_ids=p.tolist(), response_ids=r.tolist()) for p, r in zip(prompts, responses)]
    assert bits == [float(random_bit(p.numpy(), r.numpy())) for p, r in zip(prompts, responses)]
    with pytest.raises(ValueError, match="scores 3 response tokens, got 2"):
        addition_task(prompt_ids=prompts[0].tolist(), response_ids=[5, 6])
