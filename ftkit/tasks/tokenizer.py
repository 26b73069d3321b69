"""A model's Hugging Face tokenizer, loaded for a task (``transformers`` imported inside).

The result satisfies ``protocols.Tokenizer``; the addition task (``addition.TaskVocab``) and the
prompt dataset task (``prompt_task``) both read the model directory's tokenizer through here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_tokenizer(model_dir: Path) -> Any:
    """The Hugging Face tokenizer of ``model_dir``; ``ConfigError`` (exit 2) when it cannot be loaded."""
    from transformers import AutoTokenizer

    from ftkit.errors import ConfigError

    try:
        return AutoTokenizer.from_pretrained(str(model_dir))
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"cannot load the tokenizer of {model_dir}: {str(exc).splitlines()[0]}",
            hint="the model directory needs tokenizer.json / tokenizer_config.json",
        ) from None
