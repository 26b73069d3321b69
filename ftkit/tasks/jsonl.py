"""The JSONL prompt dataset: one JSON object per line, read streaming and strictly.

Each line is a JSON object holding the prompt under ``input_key`` (a string) and, when
``label_key`` is set, the reference answer under ``label_key`` (a string or a number; numbers
become their JSON text, so ``42`` and ``"42"`` are the same label). Anything else is a
``ConfigError`` (exit 2) naming ``path:line`` and what is wrong: bad UTF-8, bad JSON, a value
that is not an object, a missing key, a prompt that is not a string or is empty, a label of
another type, an empty line. Nothing is skipped: a rollout's prompts are exactly the file's
lines. The file is read line by line on each iteration (never loaded whole), so iterating twice
yields the same records and a large file costs no memory.

Parquet is not read: no light Parquet reader is a dependency of ftkit (``pyarrow`` is ~100 MB);
convert with ``pandas.read_parquet(p).to_json(out, orient="records", lines=True)``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from ftkit.errors import ConfigError, InputError
from ftkit.tasks.protocols import PromptRecord

_HINT = 'each line must be one JSON object like {{"{input}": "..."{label}}}; fix or remove line {line}'


class JsonlPrompts:
    """Prompts from a JSONL file (``PromptDataset``)."""

    def __init__(self, path: str | Path, input_key: str = "prompt", label_key: str | None = None) -> None:
        self.path = Path(path)
        self.input_key = input_key
        self.label_key = label_key
        self.name = self.path.name
        if not self.path.is_file():
            raise InputError(f"prompt file {self.path} does not exist or is not a file", hint="pass a JSONL file")

    def digest(self) -> str:
        """The xxh64 of the file's bytes (``run.json`` records it: a resumed run must read the
        same prompts)."""
        import xxhash

        h = xxhash.xxh64()
        try:
            with self.path.open("rb") as f:
                while chunk := f.read(1 << 22):
                    h.update(chunk)
        except OSError as e:
            raise InputError(f"cannot read prompt file {self.path}: {e.strerror}") from None
        return h.hexdigest()

    def __iter__(self) -> Iterator[PromptRecord]:
        try:
            f = self.path.open("rb")
        except OSError as e:
            raise InputError(f"cannot read prompt file {self.path}: {e.strerror}") from None
        with f:
            for number, raw in enumerate(f, start=1):
                yield self._record(raw, number)

    def _record(self, raw: bytes, number: int) -> PromptRecord:
        source = f"{self.path}:{number}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self._error(number, f"is not valid UTF-8 (byte {e.start})") from None
        if not line.strip():
            raise self._error(number, "is empty")
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise self._error(number, f"is not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict):
            raise self._error(number, f"holds a JSON {type(obj).__name__}, not an object")
        return PromptRecord(text=self._prompt(obj, number), label=self._label(obj, number), source=source)

    def _prompt(self, obj: dict[str, object], number: int) -> str:
        if self.input_key not in obj:
            raise self._error(number, f"has no key {self.input_key!r} (keys: {', '.join(map(repr, obj)) or 'none'})")
        text = obj[self.input_key]
        if not isinstance(text, str):
            raise self._error(number, f"key {self.input_key!r} holds a {type(text).__name__}, not a string")
        if not text.strip():
            raise self._error(number, f"key {self.input_key!r} holds an empty prompt")
        return text

    def _label(self, obj: dict[str, object], number: int) -> str | None:
        if self.label_key is None:
            return None
        if self.label_key not in obj:
            raise self._error(number, f"has no key {self.label_key!r} (keys: {', '.join(map(repr, obj)) or 'none'})")
        label = obj[self.label_key]
        if isinstance(label, bool) or not isinstance(label, (str, int, float)):
            raise self._error(number, f"key {self.label_key!r} holds a {type(label).__name__}, not a string or number")
        return label if isinstance(label, str) else json.dumps(label)

    def _error(self, number: int, what: str) -> ConfigError:
        label = f', "{self.label_key}": "..."' if self.label_key else ""
        hint = _HINT.format(input=self.input_key, label=label, line=number)
        return ConfigError(f"{self.path}:{number} {what}", hint=hint)
