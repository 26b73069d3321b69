"""Names and constants of the checkpoint layout (docs/checkpoints.md).

```
checkpoints/
  step_000011/            one published checkpoint: payload files, meta.json, MANIFEST.json (last)
  retention.json          the retention records (which checkpoints are kept, and why)
  journal.json            the intent journal of the last retention transaction
  latest -> step_000011   a relative symlink, replaced atomically by rename
  .step_000015.tmp-*      a staging directory (never published; reconcile removes stale ones)
  .deleting-step_000003-* a checkpoint being deleted (renamed first, so never half-visible)
```
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

PROTOCOL: Final = "ftkit.checkpoint/1"
RETENTION_SCHEMA = "ftkit.checkpoint-retention/1"
JOURNAL_SCHEMA = "ftkit.checkpoint-journal/1"
MANIFEST = "MANIFEST.json"
META = "meta.json"
RETENTION = "retention.json"
JOURNAL = "journal.json"
LATEST = "latest"
DELETING = ".deleting-"
#: The payload groups of a training state checkpoint (``ftkit train``'s; ``restore.state_payload``)
#: and the state fingerprint's prefix of each tensor group.
MODEL, OPTIMIZER, EXTRA = "model.safetensors", "optimizer.safetensors", "extra.safetensors"
STATE_PREFIXES = {MODEL: "param/", OPTIMIZER: "optimizer/"}
FAULT_POINTS = (
    "publish_preflight",
    "publish_write",
    "publish_scan",
    "publish_manifest",
    "publish_rename",
    "publish_journal",
    "publish_cleanup",
)
_STEP_RE = re.compile(r"step_(\d{6,})")


def step_name(step: int) -> str:
    """``step_000011`` for step 11 (the last committed run-global step the state includes)."""
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, not {step}")
    return f"step_{step:06d}"


def parse_step(name: str) -> int | None:
    """The step of a checkpoint directory name, or None when it is not one."""
    m = _STEP_RE.fullmatch(name)
    return int(m.group(1)) if m else None


def checkpoint_dirs(checkpoints: Path) -> list[Path]:
    """The ``step_*`` directories (published or not yet reconciled), oldest first."""
    found = [(parse_step(p.name), p) for p in checkpoints.iterdir() if p.is_dir() and not p.is_symlink()]
    return [p for s, p in sorted((s, p) for s, p in found if s is not None)]
