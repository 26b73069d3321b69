"""The built-in rewards, in one registry (``BUILTINS``): each has the keyword contract of
``protocols.RewardFn`` (what ``rewards.load_reward`` returns for its name).

* ``exact_match``: 1.0 when the response's answer equals the label as a number, else 0.0. The
  answer is the content of the last ``\\boxed{...}`` where the response has one, else the last
  number in the response. Numbers compare exactly as rationals (``Fraction``): ``"0.50"``,
  ``"1/2"`` and ``".5"`` are equal, thousands separators (``1,234``) are dropped, a leading
  ``+``/``-`` counts, ``\\frac{a}{b}`` is ``a/b``. A sample without a label is an error (the reward cannot be computed);
  a label that is not a number is an error too; an answer that is not a number scores 0.0.
* ``format``: 1.0 when the response states a final answer in a recognised form: a non-empty
  ``\\boxed{...}``, or a last non-empty line ``Answer: ...`` / ``Final answer: ...`` /
  ``#### ...``; else 0.0. It checks the form only, never correctness.
* ``task`` and ``deterministic_random``: token-level rewards. Per sample they score the token
  ids (``task``: the addition task's partial credit over its synthetic vocabulary;
  ``deterministic_random``: ``random_bit``, a stable hash of the ids of any vocabulary). Each
  also has a *token form* (``Builtin.tokens``, a ``BatchReward``): the same reward over a
  rollout's token tensors, which the trainer uses. ``task``'s is the run's task's own reward
  (``AdditionTask.reward``, in whatever vocabulary the task has); ``deterministic_random``'s
  hashes each prompt row and response as the rollout holds them.

All are pure functions of their arguments (deterministic by construction).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

    from ftkit.tasks.addition import AdditionTask
    from ftkit.tasks.protocols import RlTask

#: A reward over a rollout's token tensors: ``fn(task, prompts [n, P], responses [n, R]) -> float32 [n]``.
BatchReward = Callable[[Any, Any, Any], Any]

_PERSON = b"ftkit-reward"

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

    from ftkit.tasks.addition import ANSWER_LEN, AdditionTask

    if len(response_ids) < ANSWER_LEN:
        raise ValueError(f"the addition task scores {ANSWER_LEN} response tokens, got {len(response_ids)}")
    task = AdditionTask(response_len=len(response_ids))
    p = torch.tensor([list(prompt_ids)], dtype=torch.int64)
    r = torch.tensor([list(response_ids)], dtype=torch.int64)
    return float(task.reward(p, r)[0])


def random_bit(prompt: Any, response: Any) -> int:
    """0 or 1: the low bit of blake2b(int64-le(prompt) || int64-le(response)) (sequences or arrays of ints)."""
    import numpy as np

    h = hashlib.blake2b(digest_size=8, person=_PERSON)
    for part in (prompt, response):
        h.update(np.ascontiguousarray(np.asarray(part), dtype="<i8").tobytes())
    return h.digest()[0] & 1


def deterministic_random(*, prompt_ids: Sequence[int], response_ids: Sequence[int], **_: Any) -> float:
    """0.0 or 1.0: ``random_bit`` of the ids."""
    return float(random_bit(list(prompt_ids), list(response_ids)))


def task_tokens(task: AdditionTask, prompts: Tensor, responses: Tensor) -> Any:
    """float32 ``[n]``: the task's own reward (the token form of ``task``)."""
    return task.reward(prompts, responses)


def deterministic_random_tokens(task: RlTask, prompts: Tensor, responses: Tensor) -> Any:
    """float32 ``[n]`` of 0/1: ``random_bit`` of each sample's prompt row and response (the token
    form of ``deterministic_random``)."""
    import torch

    p, r = prompts.cpu().numpy(), responses.cpu().numpy()
    return torch.tensor([random_bit(p[i], r[i]) for i in range(len(p))], dtype=torch.float32)


@dataclass(frozen=True)
class Builtin:
    """A built-in reward: ``fn`` with the keyword contract, and for a token-level reward its
    token form ``tokens`` (``None`` for a text reward, which the trainer scores per sample)."""

    fn: Callable[..., float]
    tokens: BatchReward | None = None


BUILTINS: dict[str, Builtin] = {
    "exact_match": Builtin(exact_match),
    "format": Builtin(format_reward),
    "task": Builtin(addition_task, task_tokens),
    "deterministic_random": Builtin(deterministic_random, deterministic_random_tokens),
}
