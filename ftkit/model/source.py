"""Where a Hugging Face model lies, and what it holds (``ftkit.model.spec.resolve_model`` uses
both once per run).

Contract:

* ``model_dir(path)``: the Hugging Face directory of ``path`` (a directory, or a ``.gguf`` file
  converted once into the cache, ``ftkit.model.gguf_cache.hf_dir_for``); ``InputError`` (exit 2)
  when it is neither.
* ``content_digest(model_dir)``: an xxh64 over the name and bytes of every regular file directly
  in the directory (sorted by name): the config, the weights and the tokenizer files. Two
  directories with the same digest hold the same model; a run records it (``model_digest``) so
  a resume or a comparison knows which model it is.

Heavy imports stay inside the functions.
"""

from __future__ import annotations

from pathlib import Path

from ftkit.errors import InputError
from ftkit.model.presets import PRESETS


def model_dir(path: str | Path) -> Path:
    """The Hugging Face directory of ``path`` (module contract)."""
    from ftkit.model.gguf_cache import hf_dir_for

    p = Path(path)
    if not p.exists():
        raise InputError(
            f"model {path} is neither a preset ({', '.join(PRESETS)}) nor an existing path",
            "give a preset name, a Hugging Face model directory or a .gguf file",
        )
    out = hf_dir_for(p)
    if not (out / "config.json").is_file():
        raise InputError(f"model directory {out} has no config.json", "give a Hugging Face causal-LM directory")
    return out


def content_digest(directory: Path) -> str:
    """The xxh64 of ``directory``'s regular files, names and bytes (module contract)."""
    import xxhash

    h = xxhash.xxh64()
    for f in sorted(p for p in Path(directory).iterdir() if p.is_file()):
        h.update(f.name.encode() + b"\0")
        with f.open("rb") as stream:
            while chunk := stream.read(1 << 22):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()
