"""docs/library.md's API reference is generated from the docstrings and must be current."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_the_api_reference_is_current():
    pytest.importorskip("transformers")  # the reference documents the Trainer callback too
    done = subprocess.run(
        [sys.executable, "scripts/library_reference.py", "--check"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr + "\nrun: python scripts/library_reference.py"


def test_every_public_name_is_in_the_reference():
    import ftkit
    import ftkit.evidence

    text = (REPO / "docs" / "library.md").read_text()
    for name in {*ftkit.__all__, *ftkit.evidence.__all__} - {"__version__"}:
        assert f"ftkit.evidence.{name}(" in text, name
