"""The built-in verifiable task: single-digit addition, over a synthetic vocabulary or a model's
tokenizer.

A prompt is ``<bos> a + b =`` with digits ``a`` and ``b``; the correct response is the two
digits of ``a + b`` (zero padded, so ``3+4=`` -> ``07``) followed by ``<eos>``. Every prompt
has ``prompt_len`` tokens and every response exactly ``response_len`` tokens (what follows the
``<eos>`` is not scored), so the shapes of a batch never depend on its content: a sequence is
always ``prompt_len + response_len`` tokens.

The token ids come from a ``TaskVocab``: ``SYNTHETIC`` (the presets: ``VOCAB_SIZE`` (15)
tokens, inside every preset's vocabulary) or ``TaskVocab.from_tokenizer`` (a Hugging Face
model: the text prompt ``a + b =`` made of the tokenizer's single-token digits, the token ids
of ``" + "`` and ``" ="``, its ``bos_token`` when it has one, and its ``eos_token``; the same
number of tokens for every prompt by construction). Engines sample only from
``response_tokens`` (the ten digits and ``<eos>``), so no other token id is ever produced.
``heldout_prompts`` is the fixed evaluation set of a run (``--best-metric eval_reward``). The
task reward gives partial credit, the fraction of the three target positions (tens, units,
``<eos>``) that are right, so a user sees it climb as the policy learns;
``builtin_rewards`` also offers a reward that ignores correctness.

``AdditionTask`` is a ``protocols.RlTask``, the seam the training side uses (driver, engines,
ranks, canaries, rewards, checkpoints), as is the dataset-backed ``prompt_task.PromptTask``.

Heavy imports (torch, transformers) stay inside the functions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftkit.tasks.tokenizer import load_tokenizer
from ftkit.tensors.seeds import torch_generator

if TYPE_CHECKING:
    from torch import Tensor

    from ftkit.tasks.protocols import RewardSample

PAD, BOS, EOS, PLUS, EQUALS = 0, 1, 2, 3, 4
DIGIT0 = 5
VOCAB_SIZE = DIGIT0 + 10
PROMPT_LEN = 5
#: Tokens an engine may sample in a response of the synthetic vocabulary: the digits and ``<eos>``.
RESPONSE_TOKENS = (EOS, *range(DIGIT0, DIGIT0 + 10))
#: Scored response positions: tens digit, units digit, ``<eos>``.
ANSWER_LEN = 3
#: Prompts in the held-out evaluation set (``heldout_prompts``).
HELDOUT_PROMPTS = 32

_NAMES = {PAD: "<pad>", BOS: "<bos>", EOS: "<eos>", PLUS: "+", EQUALS: "="}


def _synthetic_text(tokens: Any) -> str:
    return "".join(
        _NAMES.get(int(t), str(int(t) - DIGIT0) if DIGIT0 <= int(t) < VOCAB_SIZE else f"<{int(t)}>") for t in tokens
    )


@dataclass(frozen=True)
class TaskVocab:
    """The token ids of the addition task: ``prefix`` (``<bos>`` or nothing), the ten
    ``digits``, the ids of ``plus`` and ``equals`` (one or more each), ``eos``; ``vocab_size``
    bounds them; ``text`` renders a token sequence."""

    vocab_size: int
    prefix: tuple[int, ...]
    digits: tuple[int, ...]
    plus: tuple[int, ...]
    equals: tuple[int, ...]
    eos: int
    text: Callable[[Any], str]

    @classmethod
    def from_tokenizer(cls, model_dir: Path, vocab_size: int) -> TaskVocab:
        """The ids of the Hugging Face tokenizer in ``model_dir`` for a model of ``vocab_size``
        tokens; ``ftkit.errors.ConfigError`` (exit 2) when a digit is not one token, the
        tokenizer has no ``eos_token`` or an id falls outside the model's vocabulary."""
        from ftkit.errors import ConfigError

        tok = load_tokenizer(model_dir)

        def ids(text: str) -> tuple[int, ...]:
            return tuple(int(i) for i in tok.encode(text, add_special_tokens=False))

        digits = []
        for d in range(10):
            one = ids(str(d))
            if len(one) != 1:
                raise ConfigError(
                    f"the tokenizer of {model_dir} spells the digit {d} as {len(one)} tokens",
                    hint="the built-in addition task needs one token per digit",
                )
            digits.append(one[0])
        if tok.eos_token_id is None:
            raise ConfigError(
                f"the tokenizer of {model_dir} has no eos_token", hint="set eos_token in tokenizer_config.json"
            )
        prefix = () if tok.bos_token_id is None else (int(tok.bos_token_id),)
        vocab = cls(
            vocab_size, prefix, tuple(digits), ids(" + "), ids(" ="), int(tok.eos_token_id), lambda t: _decode(tok, t)
        )
        top = max((*vocab.prefix, *vocab.digits, *vocab.plus, *vocab.equals, vocab.eos))
        if top >= vocab_size:
            raise ConfigError(
                f"the tokenizer of {model_dir} gives token id {top}, outside the model's vocabulary of {vocab_size}",
                hint="use the tokenizer the model was trained with",
            )
        return vocab


def _decode(tok: Any, tokens: Any) -> str:
    return str(tok.decode([int(t) for t in tokens if int(t) >= 0]))


SYNTHETIC = TaskVocab(VOCAB_SIZE, (BOS,), tuple(range(DIGIT0, DIGIT0 + 10)), (PLUS,), (EQUALS,), EOS, _synthetic_text)


def task_for(response_len: int, model_dir: Path | None = None, vocab_size: int = 0) -> AdditionTask:
    """The run's task: over ``SYNTHETIC`` for a preset (``model_dir`` None), else over the
    tokenizer of the Hugging Face model in ``model_dir`` (a model of ``vocab_size`` tokens)."""
    if model_dir is None:
        return AdditionTask(response_len)
    return AdditionTask(response_len, TaskVocab.from_tokenizer(model_dir, vocab_size))


class AdditionTask:
    """Single-digit addition with fixed prompt and response lengths, over ``vocab``.

    ``response_len`` is the number of tokens an engine generates per response; it must be
    at least ``ANSWER_LEN``.
    """

    name = "addition"
    stop_token: int | None = None  # every response is response_len sampled tokens

    def __init__(self, response_len: int, vocab: TaskVocab = SYNTHETIC) -> None:
        import torch

        if response_len < ANSWER_LEN:
            raise ValueError(
                f"response_len ({response_len}) must be at least {ANSWER_LEN} for the addition task "
                "(two answer digits and <eos>)"
            )
        self.response_len = response_len
        self.vocab = vocab
        self.vocab_size = vocab.vocab_size
        self.response_tokens = (vocab.eos, *vocab.digits)
        self.pad_token = vocab.eos
        # Row 10 * a + b: the prompt of a + b.
        self._table = torch.tensor(
            [
                [*vocab.prefix, vocab.digits[a], *vocab.plus, vocab.digits[b], *vocab.equals]
                for a in range(10)
                for b in range(10)
            ],
            dtype=torch.int64,
        )
        self.prompt_len = int(self._table.shape[1])

    @property
    def seq_len(self) -> int:
        """Tokens per sample: prompt plus response."""
        return self.prompt_len + self.response_len

    def prompts(self, seed: int, rollout: int, count: int) -> Any:
        """``count`` prompts (int64 ``[count, prompt_len]``) of ``rollout``, a function of
        ``(seed, rollout)`` only."""
        import torch

        g = torch_generator("prompts", seed, rollout)
        return self._prompts(torch.randint(0, 10, (count, 2), generator=g, dtype=torch.int64))

    def _prompts(self, operands: Tensor) -> Any:
        """``<bos> a + b =`` for each row ``(a, b)`` of ``operands`` (int64 ``[n, 2]``)."""
        return self._table[operands[:, 0] * 10 + operands[:, 1]]

    def heldout_prompts(self, seed: int, count: int = HELDOUT_PROMPTS) -> Any:
        """The run's fixed evaluation set: ``count`` distinct prompts (int64 ``[count,
        prompt_len]``, at most the task's 100), a function of ``seed`` only.

        They come from their own stream (``("heldout", seed)``), so the set never is a
        rollout's batch and does not move with the rollout. The task has only 100 distinct
        prompts, which training samples all of: the set is held out as a sample, not as
        content (a task with a large prompt space would get disjoint content from the same
        rule).
        """
        import torch

        if not 1 <= count <= 100:
            raise ValueError(f"the held-out set holds 1 to 100 prompts, not {count}")
        pairs = torch.randperm(100, generator=torch_generator("heldout", seed))[:count]
        return self._prompts(torch.stack([pairs // 10, pairs % 10], dim=1))

    def eval_set(self, seed: int) -> tuple[AdditionTask, Any]:
        """What ``eval_reward`` scores: ``heldout_prompts(seed)``, by this task (``--eval-prompts``
        is for prompt tasks only: the config refuses it here)."""
        return self, self.heldout_prompts(seed)

    def answers(self, prompts: Tensor) -> Any:
        """The correct first ``ANSWER_LEN`` response tokens of each prompt (int64 ``[n, 3]``)."""
        import torch

        pair = (prompts[:, None, :] == self._table[None]).all(dim=2).to(torch.int64).argmax(dim=1)
        total = pair // 10 + pair % 10
        digits = torch.tensor(self.vocab.digits, dtype=torch.int64)
        return torch.stack([digits[total // 10], digits[total % 10], torch.full_like(total, self.vocab.eos)], dim=1)

    def correct_responses(self, prompts: Tensor) -> Any:
        """The right ``response_len``-token response of each prompt: the answer, ``eos``, then
        ``eos`` again (int64 ``[n, response_len]``; what follows the first ``eos`` is not scored)."""
        import torch

        out = torch.full((prompts.shape[0], self.response_len), self.vocab.eos, dtype=torch.int64)
        out[:, :ANSWER_LEN] = self.answers(prompts)
        return out

    def response_ends(self, responses: Tensor) -> tuple[Any, Any]:
        """Every response is ``response_len`` tokens and ends there by design (``stop_token`` is
        None): all of them count as stopped, none as cut at the limit."""
        import torch

        n = responses.shape[0]
        return torch.full((n,), responses.shape[1], dtype=torch.int64), torch.ones(n, dtype=torch.bool)

    def response_mask(self, responses: Tensor) -> Any:
        """float32 ``[n, response_len]`` of ones: every generated token is learned (what follows
        ``eos`` is not scored by the task reward, but it is trained on)."""
        import torch

        return torch.ones(responses.shape, dtype=torch.float32)

    def reward_sample(self, prompt: Tensor, response: Tensor) -> RewardSample:
        """One sample as a reward plug-in sees it (``protocols.RewardSample``):
        ``prompt`` ``"3 + 4 ="``, ``response`` the generated text up to ``eos`` (``vocab.text``:
        digits as digits, e.g. ``"07"``), ``label`` the sum (``"7"``), and the token ids of both."""
        from ftkit.tasks.protocols import RewardSample

        pair = int((prompt[None, :] == self._table).all(dim=1).to(dtype=self._table.dtype).argmax())
        a, b = pair // 10, pair % 10
        p, r = [int(t) for t in prompt], [int(t) for t in response]
        end = r.index(self.vocab.eos) if self.vocab.eos in r else len(r)
        return RewardSample(f"{a} + {b} =", self.vocab.text(r[:end]), str(a + b), p, r)

    def reward(self, prompts: Tensor, responses: Tensor) -> Any:
        """float32 ``[n]``: the fraction of the three scored positions answered correctly."""
        import torch

        right = responses[:, :ANSWER_LEN] == self.answers(prompts)
        return right.to(torch.float32).sum(dim=1) / ANSWER_LEN

    def decode(self, tokens: Tensor) -> str:
        """Readable text of a token sequence, e.g. ``<bos>3+4=07<eos>`` (synthetic) or the
        tokenizer's decoding."""
        return self.vocab.text(tokens)

    def prompt_pads(self, prompts: Tensor) -> None:
        """``None``: every prompt has exactly ``prompt_len`` tokens, none is padded."""
        return None
