"""The optional parts of ftkit's install (pyproject extras) and the check that one is there.

``pip install ftkit`` gives the forensics (``analyze-events``, ``compare-dumps``, ``dump``,
``verify-checkpoint``: numpy, no torch) and the evidence API (``ftkit.evidence``, which uses the
trainer's own torch). ``ftkit[torch]`` adds torch; ``ftkit[train]`` the training stack
(torch, megatron-core, Ray) that ``ftkit train`` and ``dump --from-checkpoint`` need;
``ftkit[transformers]`` the Hugging Face ``Trainer`` callback's; ``ftkit[tracking]`` (TensorBoard),
``ftkit[wandb]`` and ``ftkit[mlflow]`` the trackers of ``ftkit train --report-to``. ``scripts/setup.sh`` installs
``.[test,train]``. ``require(extra, what)`` is called first by a command that needs an extra:
without it the command ends with exit 2 and the ``pip install`` line as the hint, never a
traceback.
"""

from __future__ import annotations

import importlib.util

from ftkit.errors import InstallError

#: extra -> the top-level modules it provides (what ``require`` looks for).
EXTRAS: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "train": ("torch", "megatron.core", "ray"),
    "transformers": ("torch", "transformers", "accelerate"),
    # ftkit train --report-to (ftkit.integrations.tracking): one extra per tracker backend.
    "tracking": ("torch", "tensorboard"),
    "wandb": ("wandb",),
    "mlflow": ("mlflow",),
}


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (found on the path), without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing or broken
        return False


def require(extra: str, what: str) -> None:
    """Raise ``InstallError`` (exit 2) unless every module of ``extra`` is installed."""
    missing = [m for m in EXTRAS[extra] if not installed(m)]
    if missing:
        raise InstallError(
            f"{what} needs ftkit's {extra!r} extra, which is not installed (missing: {', '.join(missing)})",
            f"pip install 'ftkit[{extra}]'",
        )
