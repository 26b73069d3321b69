"""``--help`` names what a user types (issue 24 item 10): no ``<bool>`` on flags, no
``<list[Path]>`` for a repeated argument, no ``{A} {B}`` in the usage line."""

from __future__ import annotations

import re

import pytest

from ftkit import cli

COMMANDS = ["train", "dump", "compare-dumps", "analyze-events", "verify-checkpoint", "check-model"]


def _help(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert cli.main([*args, "--help"]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_shows_no_python_types_or_braces(capsys: pytest.CaptureFixture[str], command: str) -> None:
    out = _help(capsys, *([command] if command else []))
    assert "<bool>" not in out
    assert "list[" not in out
    assert " range>" not in out
    assert not re.search(r"\{[A-Z]+\}", out), out


def test_usage_lines_read_like_posix_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert "Usage: ftkit compare-dumps [OPTIONS] A B" in _help(capsys, "compare-dumps")
    assert "Usage: ftkit analyze-events [OPTIONS] PATH..." in _help(capsys, "analyze-events")
    assert "Usage: ftkit dump [OPTIONS] [PATH]" in _help(capsys, "dump")
