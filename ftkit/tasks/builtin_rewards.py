"""The built-in rewards, each with the keyword contract of ``protocols.RewardFn``.

* ``exact_match``: 1.0 when the response's answer equals the label as a number, else 0.0. The
  answer is the content of the last ``\\boxed{...}`` where the response has one, else the last
  number in the response. Numbers compare exactly as rationals (``Fraction``): ``"0.50"``,
  ``"1/2"`` and ``".5"`` are equal, thousands separators (``1,234``) are dropped, a leading
  ``+``/``-`` counts, ``\\frac{a}{b}`` is ``a/b``. A sample without a label is an error (the reward cannot be computed);
  a label that is not a number is an error too; an answer that is not a number scores 0.0.
* ``format``: 1.0 when the response states a final answer in a recognised form: a non-empty
  ``\\boxed{...}``, or a last non-empty line ``Answer: ...`` / ``Final answer: ...`` /
  ``#### ...``; else 0.0. It checks the form only, never correctness.
* ``task`` and ``deterministic_random``: the rewards of the embedded addition task
  (``ftkit.train.rl.rewards``), per sample on the token ids (``task`` needs the addition task's
  vocabulary; ``deterministic_random`` hashes the ids of any vocabulary).

All are pure functions of their arguments (deterministic by construction).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:/\d+)?")
_NUMBER_IN_TEXT = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|[-+]?\.\d+")
_LATEX_FRAC = re.compile(r"\\d?frac\{\s*([-+]?\d+)\s*\}\{\s*(\d+)\s*\}")
_FINAL_LINE = re.compile(r"^\s*(?:(?:final\s+)?answer\s*[:=]|####)\s*\S", re.IGNORECASE)


def parse_number(text: str) -> Fraction | None:
    """``text`` (stripped, ``$`` and a trailing ``.`` dropped) as an exact rational, or ``None``.

    Accepted: integers, decimals, ``a/b``, ``\\frac{a}{b}`` / ``\\dfrac{a}{b}`` with integers.
    """
    t = text.strip().replace("$", "").rstrip(".").strip()
    frac = _LATEX_FRAC.fullmatch(t)
    if frac:
        t = f"{frac[1]}/{frac[2]}"
    if not t or not _NUMBER.fullmatch(t):
        return None
    t = t.replace(",", "")
    try:
        return Fraction(t)
    except (ValueError, ZeroDivisionError):
        return None


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` of ``text`` (nested braces kept), or ``None``."""
    start = text.rfind("\\boxed{")
    while start != -1:
        depth, i = 1, start + len("\\boxed{")
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start + len("\\boxed{") : i - 1]
        start = text.rfind("\\boxed{", 0, start)  # unclosed: try an earlier one
    return None


def extract_answer(response: str) -> str | None:
    """The response's answer: the last ``\\boxed{}`` content, else the last number, else ``None``."""
    boxed = last_boxed(response)
    if boxed is not None:
        return boxed
    numbers = _NUMBER_IN_TEXT.findall(response)
    return numbers[-1] if numbers else None


def exact_match(*, response: str, label: str | None, **_: Any) -> float:
    """1.0 when ``extract_answer(response)`` equals ``label`` as a number, else 0.0."""
    if label is None:
        raise ValueError("exact_match needs a label (set the dataset's label key)")
    want = parse_number(label)
    if want is None:
        raise ValueError(f"the label {label!r} is not a number")
    answer = extract_answer(response)
    got = parse_number(answer) if answer is not None else None
    return 1.0 if got == want else 0.0


def format_reward(*, response: str, **_: Any) -> float:
    """1.0 when the response gives a final answer in a recognised form, else 0.0."""
    boxed = last_boxed(response)
    if boxed is not None and boxed.strip():
        return 1.0
    lines = [line for line in response.splitlines() if line.strip()]
    return 1.0 if lines and _FINAL_LINE.match(lines[-1]) else 0.0


def addition_task(*, prompt_ids: Sequence[int], response_ids: Sequence[int], **_: Any) -> float:
    """The addition task's reward (``AdditionTask.reward``) of one sample's token ids."""
    import torch

    from ftkit.train.rl.task import ANSWER_LEN, AdditionTask  # the embedded task lives with the train core

    if len(response_ids) < ANSWER_LEN:
        raise ValueError(f"the addition task scores {ANSWER_LEN} response tokens, got {len(response_ids)}")
    task = AdditionTask(response_len=len(response_ids))
    p = torch.tensor([list(prompt_ids)], dtype=torch.int64)
    r = torch.tensor([list(response_ids)], dtype=torch.int64)
    return float(task.reward(p, r)[0])


def deterministic_random(*, prompt_ids: Sequence[int], response_ids: Sequence[int], **_: Any) -> float:
    """0.0 or 1.0 from a stable hash of the ids (``ftkit.train.rl.rewards.random_bit``)."""
    import torch

    from ftkit.train.rl.rewards import random_bit

    ids = torch.tensor(list(prompt_ids), dtype=torch.int64), torch.tensor(list(response_ids), dtype=torch.int64)
    return float(random_bit(*ids))


BUILTINS: dict[str, Callable[..., float]] = {
    "exact_match": exact_match,
    "format": format_reward,
    "task": addition_task,
    "deterministic_random": deterministic_random,
}
