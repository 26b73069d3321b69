"""Export a run's final state, or one of its checkpoints, as a Hugging Face model directory
(``ftkit export RUN_OR_CHECKPOINT --hf OUT``).

``export(path, out_dir, dtype="auto")`` dispatches on ``path``: a checkpoint directory
(``step_NNNNNN/`` or a directory holding ``MANIFEST.json``) goes to ``export_checkpoint``,
anything else to ``export_run``. Both return the shard paths ``ftkit.model.hf_export.export_hf``
wrote, and both check ``out_dir`` (new or empty) before any work, so a refused input writes
nothing there.

``dtype`` is what the tensors are written in: ``fp32`` (float32) or ``bf16`` (bfloat16), or
``auto``, the run's own precision as recorded (``fp32`` for a run recorded before ftkit recorded
it). The state exported is the float32 state of record (the masters of a bf16 run), cast once
(round to nearest, ties to even): so ``auto`` of a bf16 run writes exactly the bf16 weights the
run computed with and sent to its engines, and of an fp32 run every float32 bit. A bf16 source
checkpoint trained in fp32 comes back in float32 unless ``bf16`` is asked for.

``export_run(run_dir, out_dir)`` reads ``run.json``'s config (validated and planned,
``ftkit.train.plan.run_plan.build_plan``: the model at the recorded path must still have the recorded
``model_digest``, its config, tokenizer and
``config.json`` are what the export copies), gathers each TP rank's state from
``final/tp{t}-pp{p}.safetensors`` (the parameters, ``model.<name>``, named model-wide; the
union of the rank's pipeline stages). Memory: the whole final model state plus one shard.

``export_checkpoint(checkpoint, out_dir)``: the checkpoint must lie in ``RUN/checkpoints/``
(``RUN/checkpoints/latest`` is the checkpoint it points to).
It is verified first exactly as ``ftkit verify-checkpoint RUN`` (and ``--resume``) verify it
(``verify_path`` of the run with its event log, ``ftkit.checkpoint.selection.error_findings``):
its files, manifest, tensor fingerprints and finiteness, its retention record, the committed
state fingerprint the log holds for its step. An error finding naming it is an ``InputError``
(exit 2, one line with the first finding; nothing written), errors that name no checkpoint are
passed to ``on_warning``. Nothing in the run is changed (no journal reconcile). The config is
the checkpoint's own (``meta.json``, covered by the manifest), validated as a run's; the
parameters are its canonical (TP=1/PP=1) model group, read alone (not the optimizer). Memory:
the checkpoint's model state plus one shard.

A preset run, a run without a complete final state (it did not finish), an unreadable
``run.json`` / ``meta.json`` is an ``InputError`` (exit 2). After ``--lr 0`` every tensor is
bitwise the source's when written in the source's dtype (``auto`` of a run in the source's
precision), and its exact upcast in float32.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftkit.errors import InputError

if TYPE_CHECKING:
    import torch

    from ftkit.train.plan.run_plan import RunPlan

PREFIX = "model."


def export(
    path: Path, out_dir: Path, on_warning: Callable[[str], None] | None = None, dtype: str = "auto"
) -> list[Path]:
    """Export the run or checkpoint ``path`` to ``out_dir`` in ``dtype`` (module contract)."""
    from ftkit.checkpoint.layout import MANIFEST, parse_step

    path = Path(path)
    if (path / MANIFEST).exists() or parse_step(path.name) is not None:
        return export_checkpoint(path, out_dir, on_warning, dtype)
    return export_run(path, out_dir, dtype)


def export_run(run_dir: Path, out_dir: Path, dtype: str = "auto") -> list[Path]:
    """Write the Hugging Face directory of ``run_dir``'s final state to ``out_dir`` (module contract)."""
    from safetensors import safe_open

    from ftkit.model.hf_export import check_out_dir, export_hf
    from ftkit.train.rank.state import final_path

    run_dir = Path(run_dir)
    try:
        values = dict(json.loads((run_dir / "run.json").read_text())["config"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(
            f"{run_dir} is not a run directory: cannot read run.json ({exc})",
            "give a run directory or a checkpoint directory (RUN/checkpoints/step_NNNNNN)",
        ) from None
    plan = _hf_plan(values, run_dir)
    cfg = plan.config
    check_out_dir(Path(out_dir))
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
    return export_hf(states, plan.model.hf, Path(out_dir), plan.model.hf_dir, dtype=_written(plan, dtype))


def export_checkpoint(
    checkpoint: Path, out_dir: Path, on_warning: Callable[[str], None] | None = None, dtype: str = "auto"
) -> list[Path]:
    """Write the Hugging Face directory of the verified ``checkpoint`` to ``out_dir`` (module contract)."""
    from ftkit.checkpoint.layout import MODEL
    from ftkit.checkpoint.restore import read_groups
    from ftkit.checkpoint.selection import error_findings
    from ftkit.checkpoint.verify import verify_path
    from ftkit.model.hf_export import check_out_dir, export_hf
    from ftkit.tensors.untrusted import load_json

    checkpoint = Path(checkpoint)
    if checkpoint.is_symlink():  # RUN/checkpoints/latest
        checkpoint = checkpoint.resolve()
    run_dir = checkpoint.parent.parent
    if not checkpoint.is_dir():
        raise InputError(
            f"{checkpoint}: no such checkpoint directory", f"list {checkpoint.parent} for the published ones"
        )
    if checkpoint.parent.name != "checkpoints" or not (run_dir / "events").is_dir():
        raise InputError(
            f"{checkpoint} is not a checkpoint of a run (RUN/checkpoints/step_NNNNNN with RUN/events)",
            "export a checkpoint inside its run directory, which verification needs",
        )
    try:
        values = dict(load_json((checkpoint / "meta.json").read_bytes())["config"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(
            f"{checkpoint}: cannot read the config in meta.json ({exc})",
            f"run 'ftkit verify-checkpoint {run_dir}'",
        ) from None
    plan = _hf_plan(values, checkpoint)
    check_out_dir(Path(out_dir))
    result = verify_path(run_dir, events=True)
    untrusted, general = error_findings(result)
    why = untrusted.get(checkpoint.name)
    if why is None and checkpoint.name not in result.checkpoints:
        why = "it is not one of the run's checkpoints"
    if why is not None:
        raise InputError(
            f"checkpoint {checkpoint} does not verify ({why})",
            f"run 'ftkit verify-checkpoint {run_dir}' for every finding",
        )
    for message in general:
        (on_warning or (lambda m: None))(f"verify-checkpoint finds in {run_dir}: {message}")
    params = read_groups(checkpoint, only={MODEL})[MODEL]
    return export_hf([params], plan.model.hf, Path(out_dir), plan.model.hf_dir, dtype=_written(plan, dtype))


def _written(plan: RunPlan, dtype: str) -> str:
    """The dtype name the export writes: ``dtype`` (``fp32``, ``bf16``), or for ``auto`` the run's precision."""
    from ftkit.model.hf_build import precision_dtype

    return precision_dtype(plan.precision if dtype == "auto" else dtype)


def _hf_plan(values: dict[str, Any], where: Path) -> RunPlan:
    """The plan of a ``--model PATH`` run's recorded config (``InputError`` for a preset's); a
    record without ``precision`` (before ftkit recorded it) trained in fp32, whatever the device
    (``ftkit.train.recovery.resume_plan.recorded_config``'s rule)."""
    from ftkit.train.config import load_config
    from ftkit.train.plan.run_plan import build_plan

    plan = build_plan(load_config({"precision": "fp32", **values}))
    if plan.model.is_preset:
        raise InputError(
            f"{where} trained the preset {plan.model.name!r}, not a Hugging Face model",
            "export --hf takes a run of ftkit train --model PATH",
        )
    return plan
