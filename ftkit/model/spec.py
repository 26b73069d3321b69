"""The model a run trains, resolved once from ``--model``: ``ModelSpec``.

``--model`` is a preset name (a flavour of ftkit's GPT family, ``ftkit.model.presets``) or the
path of a Hugging Face causal-LM directory or ``.gguf`` file (``ftkit.model.source``).
``resolve_model(name, digest)`` reads it once: the family, the shapes (``arch``: a
``ModelPreset`` or the ``HFArch`` of the directory's ``config.json``, both with the same shape
fields), the dtype, the source directory and its content digest. Everything after that (the
build, the task's tokenizer, export, engines) takes the ``ModelSpec``; nothing resolves the
name again. A ``ModelSpec`` is a small frozen value, cheap to pickle (Ray actors receive it).

Contract of ``resolve_model``:

* a preset: ``ModelSpec(name, "gpt", preset)``; a ``digest`` given with it is a ``ValueError``
  (only a path has one).
* a path: recorded absolute (``name``), its Hugging Face directory (``source``; a ``.gguf`` is
  converted once into the cache), the xxh64 of its files (``digest``). A ``digest`` given (a
  resumed run's record) that differs is a ``ValueError``: the run would train another model.
  A path that is not a model is an ``InputError``, a ``config.json`` ftkit cannot represent a
  ``ModelConfigError`` (both exit 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ftkit.model.hf_config import HFArch
from ftkit.model.presets import FAMILY, PRESETS, ModelPreset


def is_preset(name: str) -> bool:
    """Whether ``name`` names a model preset (``tiny``, ``small``) rather than a path."""
    return name in PRESETS


@dataclass(frozen=True)
class ModelSpec:
    """One model, resolved (module docstring): ``name`` as the run records it (a preset name or
    an absolute path), ``family`` (``gpt`` for a preset, else the Hugging Face family),
    ``arch`` (its shapes), ``source`` (the Hugging Face directory; None for a preset) and
    ``digest`` (of ``source``; empty for a preset)."""

    name: str
    family: str
    arch: ModelPreset | HFArch
    source: Path | None = None
    digest: str = ""

    @property
    def is_preset(self) -> bool:
        """Whether the model is a preset (built from a seed, no checkpoint, no tokenizer)."""
        return self.source is None

    @property
    def dtype(self) -> str:
        """The dtype of the model's weights as stored (``float32`` for a preset)."""
        return self.arch.dtype

    @property
    def hf(self) -> HFArch:
        """The Hugging Face architecture; ``ValueError`` for a preset."""
        if not isinstance(self.arch, HFArch):
            raise ValueError(f"the {self.name!r} preset is not a Hugging Face model")
        return self.arch

    @property
    def hf_dir(self) -> Path:
        """The Hugging Face directory (config, weights, tokenizer); ``ValueError`` for a preset."""
        if self.source is None:
            raise ValueError(f"the {self.name!r} preset has no model directory")
        return self.source


def resolve_model(name: str, digest: str = "") -> ModelSpec:
    """The ``ModelSpec`` of ``--model name`` (module contract); ``digest``: the one a run
    recorded, checked against the model's."""
    from ftkit.model.families import load_arch
    from ftkit.model.source import content_digest, model_dir

    if is_preset(name):
        if digest:
            raise ValueError(f"model_digest is for a model path, not the preset {name!r}")
        return ModelSpec(name, FAMILY, PRESETS[name])
    path = str(Path(name).absolute())
    source = model_dir(path)
    actual = content_digest(source)
    if digest and digest != actual:
        raise ValueError(f"the model at {path} has changed: its content digest is {actual}, the run recorded {digest}")
    arch = load_arch(source)
    return ModelSpec(path, arch.family, arch, source, actual)
