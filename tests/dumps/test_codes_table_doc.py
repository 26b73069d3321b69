"""docs/dumps.md lists every CDxxx code exactly as compare-dumps defines it."""

from __future__ import annotations

from pathlib import Path

from ftkit.dumps.codes import TABLE


def test_codes_table_in_docs_is_current() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "dumps.md").read_text()
    assert TABLE.markdown() in doc, "regenerate the table with ftkit.dumps.codes.TABLE.markdown()"
