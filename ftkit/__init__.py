"""ftkit: fault-tolerant Megatron training on Ray, and the forensics to prove a run stayed correct.

The public library API (stable under semantic versioning, docs/library.md) is what ``__all__``
lists: the evidence API any trainer uses to log ftkit's evidence (``ftkit.evidence``), loaded on
first use, so ``import ftkit`` itself imports nothing heavy (neither torch, megatron, Ray nor
pydantic). The library never imports Typer or Rich; heavy imports happen inside the functions
that need them so that ``ftkit --help`` and ``ftkit analyze-events`` stay fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ftkit.version import __version__

__all__ = ["EvidenceProfile", "EvidenceRun", "WitnessTable", "__version__", "fingerprint_state"]

if TYPE_CHECKING:  # pragma: no cover
    from ftkit.evidence import EvidenceProfile, EvidenceRun, WitnessTable, fingerprint_state


def __getattr__(name: str) -> Any:
    """The names of ``__all__`` from ``ftkit.evidence``, imported on first access."""
    if name in __all__:
        import ftkit.evidence

        return getattr(ftkit.evidence, name)
    raise AttributeError(f"module 'ftkit' has no attribute {name!r}")
