"""The typed contracts of the task layer: prompt records, datasets, tokenizers, rewards, tasks.

Everything here is structural (``typing.Protocol``): a Hugging Face tokenizer is a
``Tokenizer`` without ftkit importing ``transformers``; any callable with the keyword contract
below is a ``RewardFn``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


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


class Task(Protocol):
    """A verifiable task: its prompts and the reward (a ``load_reward`` spec) that scores them."""

    @property
    def name(self) -> str: ...

    def prompts(self) -> PromptDataset: ...

    def reward_spec(self) -> str: ...
