"""Which tests a run covers: the representative subset (the default, what CI runs) or all.

``FTKIT_FULL_TESTS=1`` runs the full suite: every test marked ``full`` (``tests/conftest.py``
skips them otherwise, saying how to run them) and the whole matrices of the modules that read
``FULL`` (every fault kind at every point, every publication phase, every node-loss case, every
signal at every moment, every model family in every layout, the real-model runs). The subset
keeps at least one test of every behaviour; ``full`` marks the scenarios that repeat a
behaviour another CI test already proves from its artefacts, on another fault, layout or
engine, so that CI stays well under 30 minutes. ``FTKIT_FULL_FAULT_MATRIX=1``, the older name,
means the same.
"""

from __future__ import annotations

import os

FULL = os.environ.get("FTKIT_FULL_TESTS") == "1" or os.environ.get("FTKIT_FULL_FAULT_MATRIX") == "1"
SKIP_REASON = "full suite only: set FTKIT_FULL_TESTS=1"
