"""A ``.gguf`` file as a Hugging Face directory: converted once, dequantized, cached.

``hf_dir_for(path)`` returns ``path`` itself for a directory; for a ``.gguf`` file, the cached
directory ``<cache>/<file stem>-<xxh64 of the file's bytes>-v1/`` (``<cache>`` is ``$FTKIT_CACHE``,
else ``$XDG_CACHE_HOME/ftkit/gguf``, else ``~/.cache/ftkit/gguf``), converting first when it is
not there yet. The conversion loads the file with ``transformers`` (``gguf_file=``, needs the
``gguf`` package), which dequantizes every tensor to float32, and writes the state itself
(``save_pretrained`` refuses a GGUF-quantized model): ``model.safetensors`` (a tied model without
``lm_head.weight``), ``config.json`` (``dtype`` float32, the ``architectures`` of the loaded
class, no ``quantization_config``), and the tokenizer (with its chat template) that the GGUF file
carries. It is built in a temporary directory and renamed into
place, so a cache entry is complete or absent; the content hash makes a changed file a new entry.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ftkit.errors import InputError

FORMAT = "v1"  # part of the cache entry's name: a new conversion format makes new entries


def cache_root() -> Path:
    """Where converted GGUF files live (module docstring)."""
    if os.environ.get("FTKIT_CACHE"):
        return Path(os.environ["FTKIT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ftkit" / "gguf"


def _digest(path: Path) -> str:
    import xxhash

    h = xxhash.xxh64()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def hf_dir_for(path: Path) -> Path:
    """A Hugging Face directory for ``path`` (a directory, or a ``.gguf`` file converted once)."""
    path = Path(path)
    if path.is_dir():
        return path
    if path.suffix.lower() != ".gguf":
        raise InputError(f"{path} is neither a model directory nor a .gguf file", "give a Hugging Face directory")
    try:
        key = _digest(path)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}", "give a readable .gguf file") from None
    target = cache_root() / f"{path.stem}-{key}-{FORMAT}"
    if not (target / "config.json").is_file():
        convert_gguf(path, target)
    return target


def convert_gguf(path: Path, target: Path) -> None:
    """Write the dequantized Hugging Face directory of the GGUF file ``path`` to ``target``."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except (OSError, ValueError, RuntimeError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise InputError(
            f"transformers cannot load {path}: {exc}", "is it a GGUF file of a supported family?"
        ) from None
    tied = bool(model.config.tie_word_embeddings)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)  # the state written is dequantized
    config.update(dtype="float32", architectures=[type(model).__name__])
    (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tokenizer.save_pretrained(str(tmp))
    shutil.rmtree(target, ignore_errors=True)
    os.rename(tmp, target)
