"""Export a run's final state as a Hugging Face model directory (``ftkit export RUN --hf OUT``).

``export_run(run_dir, out_dir)`` reads ``run.json``'s config (validated: the model at the
recorded path must still have the recorded ``model_digest``, its config, tokenizer and
``config.json`` are what the export copies), gathers each TP rank's state from
``final/tp{t}-pp{p}.safetensors`` (the parameters, ``model.<name>``, named model-wide; the
union of the rank's pipeline stages) and writes ``ftkit.model.hf_export.export_hf``'s
directory; it returns the shard paths. A run of a preset, a run without a complete final
state (it did not finish) or an unreadable ``run.json`` is an ``InputError`` (exit 2). The
exported tensors are the final weights cast to the checkpoint's dtype: after ``--lr 0`` every
tensor is bitwise the source's. Memory: the whole final model state plus one shard.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from ftkit.errors import InputError

if TYPE_CHECKING:
    import torch

PREFIX = "model."


def export_run(run_dir: Path, out_dir: Path) -> list[Path]:
    """Write the Hugging Face directory of ``run_dir``'s final state to ``out_dir`` (module contract)."""
    from safetensors import safe_open

    from ftkit.model.hf_export import export_hf
    from ftkit.train.config import load_config
    from ftkit.train.rank.state import final_path

    run_dir = Path(run_dir)
    try:
        values = dict(json.loads((run_dir / "run.json").read_text())["config"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(
            f"{run_dir} is not a run directory: cannot read run.json ({exc})", "give a run directory"
        ) from None
    cfg = load_config(values)
    if cfg.model.is_preset:
        raise InputError(
            f"{run_dir} trained the preset {cfg.model.preset!r}, not a Hugging Face model",
            "export --hf takes a run of ftkit train --model PATH",
        )
    states: list[dict[str, torch.Tensor]] = []
    for t in range(cfg.layout.tp):
        state: dict[str, torch.Tensor] = {}
        for p in range(cfg.layout.pp):
            path = final_path(run_dir, t, p)
            if not path.is_file():
                raise InputError(f"{run_dir} has no final state {path.name}", "export a run that completed")
            with safe_open(str(path), "pt") as f:
                for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    if key.startswith(PREFIX):
                        state[key[len(PREFIX) :]] = f.get_tensor(key)
        states.append(state)
    return export_hf(states, cfg.hf_arch(), Path(out_dir), cfg.model_dir())
