"""Shipped datasets and the task that pairs a prompt dataset with its reward.

``arithmetic``: ``data/arithmetic.jsonl``, 4000 generated arithmetic word problems (one- and
two-step; integer answers), each line ``{"prompt": ..., "answer": ...}``, scored by
``exact_match``. It is written by ``scripts/make_arithmetic_dataset.py`` (deterministic; a test
checks the shipped bytes) and installed as package data. The embedded default of ``ftkit
train`` stays the token-level addition task (``ftkit.train.rl.task``), which needs no tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from ftkit.errors import ConfigError
from ftkit.tasks.jsonl import JsonlPrompts


@dataclass(frozen=True)
class PromptTask:
    """A ``Task``: prompts from a JSONL file and the reward spec that scores them."""

    name: str
    path: Path
    input_key: str
    label_key: str | None
    reward: str

    def prompts(self) -> JsonlPrompts:
        return JsonlPrompts(self.path, self.input_key, self.label_key)

    def reward_spec(self) -> str:
        return self.reward


def arithmetic_path() -> Path:
    """Where the installed ``arithmetic.jsonl`` is."""
    return Path(str(files("ftkit.tasks") / "data" / "arithmetic.jsonl"))


SHIPPED: dict[str, PromptTask] = {
    "arithmetic": PromptTask("arithmetic", arithmetic_path(), "prompt", "answer", "exact_match"),
}


def shipped_task(name: str) -> PromptTask:
    """The shipped task called ``name`` (``ConfigError`` listing the names otherwise)."""
    try:
        return SHIPPED[name]
    except KeyError:
        raise ConfigError(
            f"no shipped dataset {name!r}", hint=f"shipped: {', '.join(SHIPPED)}; or pass a JSONL file"
        ) from None
