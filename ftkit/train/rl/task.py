"""The built-in verifiable task: single-digit addition over a synthetic vocabulary.

A prompt is ``<bos> a + b =`` with digits ``a`` and ``b``; the correct response is the two
digits of ``a + b`` (zero padded, so ``3+4=`` -> ``07``) followed by ``<eos>``. Every prompt
has ``PROMPT_LEN`` tokens and every response exactly ``response_len`` tokens (what follows the
``<eos>`` is not scored), so the shapes of a batch never depend on its content: a sequence is
always ``PROMPT_LEN + response_len`` tokens.

The vocabulary has ``VOCAB_SIZE`` (15) tokens; it fits inside every model preset's
vocabulary (the model's extra token ids are never produced: engines sample only from
``RESPONSE_TOKENS``). ``heldout_prompts`` is the fixed evaluation set of a run
(``--best-metric eval_reward``). The task reward gives partial credit, the fraction of the three target
positions (tens, units, ``<eos>``) that are right, so a user sees it climb as the policy
learns; ``ftkit.train.rl.rewards`` also offers a reward that ignores correctness.

Heavy imports (torch) stay inside the functions.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ftkit.train.rl.seeds import torch_generator

if TYPE_CHECKING:
    from torch import Tensor

    from ftkit.tasks.protocols import RewardSample

PAD, BOS, EOS, PLUS, EQUALS = 0, 1, 2, 3, 4
DIGIT0 = 5
VOCAB_SIZE = DIGIT0 + 10
PROMPT_LEN = 5
#: Tokens an engine may sample in a response: the ten digits and ``<eos>``.
RESPONSE_TOKENS = (EOS, *range(DIGIT0, DIGIT0 + 10))
#: Scored response positions: tens digit, units digit, ``<eos>``.
ANSWER_LEN = 3
#: Prompts in the held-out evaluation set (``heldout_prompts``).
HELDOUT_PROMPTS = 32

_NAMES = {PAD: "<pad>", BOS: "<bos>", EOS: "<eos>", PLUS: "+", EQUALS: "="}


class AdditionTask:
    """Single-digit addition with fixed prompt and response lengths.

    ``response_len`` is the number of tokens an engine generates per response; it must be
    at least ``ANSWER_LEN``.
    """

    name = "addition"
    vocab_size = VOCAB_SIZE
    prompt_len = PROMPT_LEN
    response_tokens = RESPONSE_TOKENS

    def __init__(self, response_len: int) -> None:
        if response_len < ANSWER_LEN:
            raise ValueError(
                f"response_len ({response_len}) must be at least {ANSWER_LEN} for the addition task "
                "(two answer digits and <eos>)"
            )
        self.response_len = response_len

    @property
    def seq_len(self) -> int:
        """Tokens per sample: prompt plus response."""
        return self.prompt_len + self.response_len

    def prompts(self, seed: int, rollout: int, count: int) -> Any:
        """``count`` prompts (int64 ``[count, PROMPT_LEN]``) of ``rollout``, a function of
        ``(seed, rollout)`` only."""
        import torch

        g = torch_generator("prompts", seed, rollout)
        return self._prompts(torch.randint(0, 10, (count, 2), generator=g, dtype=torch.int64))

    @staticmethod
    def _prompts(operands: Tensor) -> Any:
        """``<bos> a + b =`` for each row ``(a, b)`` of ``operands`` (int64 ``[n, 2]``)."""
        import torch

        count = operands.shape[0]
        out = torch.empty((count, PROMPT_LEN), dtype=torch.int64)
        out[:, 0] = BOS
        out[:, 1] = DIGIT0 + operands[:, 0]
        out[:, 2] = PLUS
        out[:, 3] = DIGIT0 + operands[:, 1]
        out[:, 4] = EQUALS
        return out

    def heldout_prompts(self, seed: int, count: int = HELDOUT_PROMPTS) -> Any:
        """The run's fixed evaluation set: ``count`` distinct prompts (int64 ``[count,
        PROMPT_LEN]``, at most the task's 100), a function of ``seed`` only.

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

    def answers(self, prompts: Tensor) -> Any:
        """The correct first ``ANSWER_LEN`` response tokens of each prompt (int64 ``[n, 3]``)."""
        import torch

        total = (prompts[:, 1] - DIGIT0) + (prompts[:, 3] - DIGIT0)
        return torch.stack([DIGIT0 + total // 10, DIGIT0 + total % 10, torch.full_like(total, EOS)], dim=1)

    def correct_responses(self, prompts: Tensor) -> Any:
        """The right ``response_len``-token response of each prompt: the answer, ``<eos>``,
        then ``<pad>`` (int64 ``[n, response_len]``)."""
        import torch

        out = torch.full((prompts.shape[0], self.response_len), PAD, dtype=torch.int64)
        out[:, :ANSWER_LEN] = self.answers(prompts)
        return out

    def reward_sample(self, prompt: Tensor, response: Tensor) -> RewardSample:
        """One sample as a reward plug-in sees it (``ftkit.tasks.protocols.RewardSample``):
        ``prompt`` ``"3 + 4 ="``, ``response`` the generated text up to ``<eos>`` (digits as
        digits, any other token as its ``decode`` name, e.g. ``"07"``), ``label`` the sum
        (``"7"``), and the token ids of both."""
        from ftkit.tasks.protocols import RewardSample

        p, r = [int(t) for t in prompt], [int(t) for t in response]
        a, b = p[1] - DIGIT0, p[3] - DIGIT0
        end = r.index(EOS) if EOS in r else len(r)
        return RewardSample(f"{a} + {b} =", self.decode(r[:end]), str(a + b), p, r)

    def reward(self, prompts: Tensor, responses: Tensor) -> Any:
        """float32 ``[n]``: the fraction of the three scored positions answered correctly."""
        import torch

        right = responses[:, :ANSWER_LEN] == self.answers(prompts)
        return right.to(torch.float32).sum(dim=1) / ANSWER_LEN

    def decode(self, tokens: Iterable[Any]) -> str:
        """Readable text of a token sequence, e.g. ``<bos>3+4=07<eos>``."""
        return "".join(
            _NAMES.get(int(t), str(int(t) - DIGIT0) if DIGIT0 <= int(t) < VOCAB_SIZE else f"<{int(t)}>") for t in tokens
        )
