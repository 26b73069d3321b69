"""The model-family seam: which module maps which Hugging Face architecture.

A family is a module with ``NAME``, ``ARCHITECTURES`` (the ``architectures`` values of
``config.json`` it accepts) and ``parse(config, architecture) -> HFArch`` (``ModelFamily``).
Everything after parsing (building the megatron-core model, the name and layout mapping, import
and export) is driven by the ``HFArch`` alone, so adding a family is one module plus one line in
``FAMILY_MODULES``.

``arch_for(config)`` picks the family by ``architectures`` (exactly one entry) and parses;
``load_arch(model_dir)`` does it for a directory. Both raise ``ModelConfigError`` (exit 2).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Protocol, cast

from ftkit.model.hf_config import HFArch, ModelConfigError, read_config

FAMILY_MODULES: tuple[str, ...] = ("llama", "qwen2", "qwen3", "mistral")


class ModelFamily(Protocol):
    NAME: str
    ARCHITECTURES: tuple[str, ...]

    def parse(self, config: dict[str, Any], architecture: str) -> HFArch:
        """The ``HFArch`` of ``config``; ``ModelConfigError`` naming any field it cannot map."""
        ...


def families() -> dict[str, ModelFamily]:
    """Architecture name -> family module, for every registered family."""
    out: dict[str, ModelFamily] = {}
    for name in FAMILY_MODULES:
        module = cast(ModelFamily, importlib.import_module(f"ftkit.model.{name}"))
        for arch in module.ARCHITECTURES:
            out[arch] = module
    return out


def arch_for(config: dict[str, Any]) -> HFArch:
    """The ``HFArch`` of a Hugging Face config dict."""
    archs = config.get("architectures")
    known = families()
    if not isinstance(archs, list) or len(archs) != 1 or not isinstance(archs[0], str):
        raise ModelConfigError(
            f"config.json field 'architectures' = {archs!r}: expected a list of one architecture",
            f"supported: {', '.join(known)}",
        )
    family = known.get(archs[0])
    if family is None:
        raise ModelConfigError(
            f"config.json field 'architectures' = {archs!r}: not a supported architecture",
            f"supported: {', '.join(known)}",
        )
    return family.parse(config, archs[0])


def load_arch(model_dir: Path) -> HFArch:
    """The ``HFArch`` of the Hugging Face model directory ``model_dir``."""
    return arch_for(read_config(Path(model_dir)))
