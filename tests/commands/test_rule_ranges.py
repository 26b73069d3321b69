"""The rule ranges README and --help name are the codes that exist (issue 24 item 10)."""

from __future__ import annotations

from pathlib import Path

from ftkit.checkpoint.codes import TABLE
from ftkit.commands.verify_checkpoint import HELP

README = Path(__file__).resolve().parents[2] / "README.md"


def test_verify_checkpoint_range_names_the_last_code() -> None:
    codes = sorted(TABLE.codes)
    span = f"{codes[0]}-{codes[-1]}"
    assert span in HELP and README.read_text().count(span) >= 2
