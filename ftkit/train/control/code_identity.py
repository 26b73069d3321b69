"""The driver and its Ray workers run the same ftkit, or the run does not start.

Ray puts the driver's working directory first on its workers' import path, so ``ftkit train``
started from inside another checkout of ftkit ran the installed ftkit in the driver and the
checkout's in every actor (seen: every cell failed with "compiled kernels not built" and was
restarted in a loop). ``check_same_code`` runs one small task on every alive node before any
actor starts; each reports where its ``ftkit`` comes from and a digest of its sources, and any
difference from the driver's is a ``ConfigError`` (exit 2) that names both.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from ftkit.errors import ConfigError

PROBE_TIMEOUT_S = 120.0  # a worker process starting on a loaded host takes seconds, not minutes


@dataclass(frozen=True)
class CodeIdentity:
    """Where a process's ``ftkit`` package is and a digest of its Python sources."""

    path: str
    digest: str


def code_identity() -> CodeIdentity:
    """This process's ftkit: its package directory and the blake2b digest of every ``.py`` file
    under it (relative path and bytes, in sorted order). Same sources anywhere -> same digest."""
    import ftkit

    root = Path(ftkit.__file__).resolve().parent
    h = hashlib.blake2b(digest_size=16)
    for f in sorted(root.rglob("*.py")):
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        h.update(f.read_bytes())
        h.update(b"\0")
    return CodeIdentity(str(root), h.hexdigest())


def check_same_code(mine: CodeIdentity | None = None) -> None:
    """Raise ``ConfigError`` unless a Ray worker on every alive node imports the same ftkit as
    ``mine`` (default: this driver's; see the module docstring). Needs Ray initialised."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    mine = mine or code_identity()
    probe = ray.remote(num_cpus=0)(code_identity)
    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote() for n in nodes]
    for node, ref in zip(nodes, refs):
        try:
            theirs: CodeIdentity = ray.get(ref, timeout=PROBE_TIMEOUT_S)
        except ray.exceptions.RayTaskError as exc:  # their ftkit lacks this module, or fails to import
            cause = str(exc).strip().splitlines()[-1][:200]
            raise _mismatch(mine, f"an ftkit without this check ({cause})", node) from None
        if theirs != mine:
            raise _mismatch(mine, f"{theirs.path} (sources {theirs.digest[:12]})", node)


def _mismatch(mine: CodeIdentity, theirs: str, node: str) -> ConfigError:
    return ConfigError(
        f"the Ray workers on node {node[:12]} import another ftkit than this driver: driver "
        f"{mine.path} (sources {mine.digest[:12]}), workers: {theirs}",
        hint="Ray puts the working directory on its workers' import path: run `ftkit train` from a "
        "directory that holds no other ftkit checkout, or install the same ftkit on every node",
    )
