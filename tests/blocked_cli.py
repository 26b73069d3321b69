"""The ``ftkit`` CLI run in a subprocess with some top-level modules unimportable, as in an install
without them (an optional extra not installed): ``ftkit_without(blocked, *args)``. Exit 99 when a
blocked module was imported anyway (a top-level import that should be lazy)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BLOCKED_CLI = """
import sys
blocked = set(sys.argv[1].split(","))
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Blocker())
from ftkit import cli
code = cli.main(sys.argv[2:])
leaked = sorted(blocked & {m.split(".")[0] for m in sys.modules})
sys.exit(99 if leaked else code)
"""


def ftkit_without(
    blocked: str, *args: str, cwd: Path = REPO, timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    """``ftkit *args`` with the comma-separated top-level modules ``blocked`` unimportable."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", BLOCKED_CLI, blocked, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
