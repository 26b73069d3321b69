"""Shipped datasets.

``arithmetic``: ``data/arithmetic.jsonl``, 4000 generated arithmetic word problems (one- and
two-step; integer answers), each line ``{"prompt": ..., "answer": ...}`` (read it with
``jsonl.JsonlPrompts(arithmetic_path(), "prompt", "answer")``), scored by ``exact_match``
(``builtin_rewards``). It is written by ``scripts/make_arithmetic_dataset.py``
(deterministic; a test checks the shipped bytes) and installed as package data. The embedded
default of ``ftkit train`` stays the token-level addition task (``addition``), which needs no
tokenizer.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def arithmetic_path() -> Path:
    """Where the installed ``arithmetic.jsonl`` is."""
    return Path(str(files("ftkit.tasks") / "data" / "arithmetic.jsonl"))
