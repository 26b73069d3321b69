"""The typed contracts of the task layer: prompt records, datasets, tokenizers, rewards, tasks.

Everything here is structural (``typing.Protocol``): a Hugging Face tokenizer is a
``Tokenizer`` without ftkit importing ``transformers``; any callable with the keyword contract
below is a ``RewardFn``; the training side asks of a task only what ``RlTask`` says (the
built-in ``addition.AdditionTask`` and the dataset-backed ``prompt_task.PromptTask`` implement it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class PromptRecord:
    """One prompt of a dataset.

    ``text`` is the user's prompt (before any chat template), ``label`` the reference answer as a
    string (``None`` when the dataset has no label column), ``source`` where it came from
    (``path:line``), for error messages that point at the input.
    """

    text: str
    label: str | None
    source: str


class PromptDataset(Protocol):
    """An iterable of ``PromptRecord`` in file order; iterating twice yields the same records."""

    @property
    def name(self) -> str: ...

    def __iter__(self) -> Iterator[PromptRecord]: ...


@runtime_checkable
class Tokenizer(Protocol):
    """What ftkit uses of a tokenizer (the ``transformers`` method names and meanings).

    ``encode(text, add_special_tokens=...)`` returns token ids. A tokenizer with a chat template
    also has a non-empty ``chat_template`` and ``apply_chat_template(messages, tokenize=False,
    add_generation_prompt=True) -> str``; ``batching.render_prompt`` uses it where present.
    ``pad_token_id`` may be ``None`` (then the caller names the pad id).
    """

    pad_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...


class RewardFn(Protocol):
    """The reward contract: called with keywords only, returns a finite float.

    ``prompt`` is the prompt text as the model saw it (chat template applied), ``response`` the
    decoded response, ``label`` the dataset's reference answer (``None`` without one),
    ``prompt_ids`` / ``response_ids`` the token ids (unpadded sequences of int). A plug-in may take
    ``**kwargs`` and ignore what it does not need. It must be deterministic: the same arguments
    give the same float, in any process, at any time.
    """

    def __call__(
        self,
        *,
        prompt: str,
        response: str,
        label: str | None,
        prompt_ids: Sequence[int],
        response_ids: Sequence[int],
    ) -> float: ...


@dataclass(frozen=True)
class RewardSample:
    """The arguments of one reward call (one response of a rollout)."""

    prompt: str
    response: str
    label: str | None
    prompt_ids: Sequence[int]
    response_ids: Sequence[int]

    def kwargs(self) -> dict[str, Any]:
        """The contract's keyword arguments."""
        return {
            "prompt": self.prompt,
            "response": self.response,
            "label": self.label,
            "prompt_ids": self.prompt_ids,
            "response_ids": self.response_ids,
        }


class RlTask(Protocol):
    """The task contract: what training asks of a task. Shapes are fixed per run: every prompt
    row has ``prompt_len`` tokens and every response ``response_len``, so a sequence is always
    ``seq_len = prompt_len + response_len`` tokens whatever the data.

    * ``name``, ``vocab_size``, ``prompt_len``, ``response_len``, ``seq_len``;
    * ``response_tokens``: the token ids an engine may sample (its policy's support);
    * ``stop_token``: ``None`` (every response is ``response_len`` sampled tokens) or the id
      after which an engine stops: the rest of the response is ``pad_token`` and unlearned;
    * ``prompts(seed, rollout, count)``: int64 ``[count, prompt_len]``, a function of
      ``(seed, rollout)`` only; ``heldout_prompts(seed, count)``: the run's fixed canary set (and
      evaluation set, unless the task has its own); ``eval_set(seed)``: ``(task, prompts)``, the
      prompts ``eval_reward`` scores and the task that scores them (``--eval-prompts``);
    * ``correct_responses(prompts)``: int64 ``[n, response_len]``, a right answer per prompt;
    * ``response_ends(responses)``: int64 ``[n]`` lengths and bool ``[n]`` stopped: each
      response's tokens through its end (``eos``, a stop string), ``response_len`` and False
      for one cut at the limit (a fixed-length task's responses all end where they should: True);
    * ``response_mask(responses)``: float32 ``[n, response_len]``, 1 on the response tokens
      that are learned;
    * ``reward_sample(prompt, response)``: one sample as a reward plug-in sees it;
    * ``decode(tokens)``: readable text;
    * ``prompt_pads(prompts)``: int64 ``[n]``, the left padding of each prompt row (tokens the
      model must not attend to: ``ftkit.train.rl.masks``), or ``None`` for a task whose prompts
      are never padded.
    """

    name: str
    vocab_size: int
    prompt_len: int
    response_len: int
    response_tokens: tuple[int, ...]
    stop_token: int | None
    pad_token: int

    @property
    def seq_len(self) -> int: ...

    def prompts(self, seed: int, rollout: int, count: int) -> Any: ...

    def heldout_prompts(self, seed: int, count: int = ...) -> Any: ...

    def eval_set(self, seed: int) -> tuple[RlTask, Any]: ...

    def correct_responses(self, prompts: Tensor) -> Any: ...

    def response_ends(self, responses: Tensor) -> tuple[Any, Any]: ...

    def response_mask(self, responses: Tensor) -> Any: ...

    def reward_sample(self, prompt: Tensor, response: Tensor) -> RewardSample: ...

    def decode(self, tokens: Tensor) -> str: ...

    def prompt_pads(self, prompts: Tensor) -> Any: ...
