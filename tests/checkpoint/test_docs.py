"""docs/checkpoints.md lists every FT2xx rule exactly as the verifier defines it."""

from __future__ import annotations

from pathlib import Path

from ftkit.checkpoint.codes import rules_markdown


def test_rules_table_in_docs_is_current() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "checkpoints.md").read_text()
    assert rules_markdown() in doc, "regenerate the table with ftkit.checkpoint.codes.rules_markdown()"
