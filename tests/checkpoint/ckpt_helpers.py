"""Helpers of the checkpoint tests: a realistic payload and a publishing loop.

Also runnable as a script (the crash tests' child process):
``python ckpt_helpers.py DIR POINT N`` publishes N checkpoints, then one more with a fault
hook that SIGKILLs the process at POINT; ``POINT=loop`` publishes forever (killed from outside).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import numpy as np

PREFIXES = {"model.safetensors": "param/", "optimizer.safetensors": "optimizer/"}


def payload(step: int, scale: int = 1, nonfinite: str | None = None, torch_tensors: bool = True):  # noqa: ANN201
    """A ``Payload``: model (f32 and, with torch, bf16) and optimizer state (moments, step) in the
    TP=1/PP=1 layout, plus RNG and counters. ``torch_tensors=False`` uses numpy only (the
    crash tests' child starts faster without importing torch)."""
    from ftkit.checkpoint.publish import Payload

    if torch_tensors:
        import torch

        g = torch.Generator().manual_seed(step)
        model = {
            "decoder.layers.0.mlp.linear_fc1.weight": torch.randn(64 * scale, 32, generator=g),
            "embedding.word_embeddings.weight": torch.randn(128, 16 * scale, generator=g).to(torch.bfloat16),
        }
        optim = {f"{n}.exp_avg": torch.randn(t.shape, generator=g) for n, t in model.items()}
        optim.update({f"{n}.exp_avg_sq": torch.rand(t.shape, generator=g) for n, t in model.items()})
        optim.update({f"{n}.step": torch.tensor(float(step + 1)) for n in model})
    else:
        r = np.random.default_rng(step)
        model = {
            "decoder.layers.0.mlp.linear_fc1.weight": r.standard_normal((64 * scale, 32), dtype=np.float32),
            "embedding.word_embeddings.weight": r.standard_normal((128, 16 * scale)).astype(np.float16),
        }
        optim = {f"{n}.exp_avg": r.standard_normal(t.shape).astype(np.float32) for n, t in model.items()}
        optim.update({f"{n}.exp_avg_sq": r.random(t.shape, dtype=np.float32) for n, t in model.items()})
        optim.update({f"{n}.step": np.array(float(step + 1), dtype=np.float32) for n in model})
    rng = {"torch_cpu": np.arange(16, dtype=np.uint8), "counters": np.array([step, step // 4], dtype=np.int64)}
    if nonfinite is not None:
        optim[nonfinite].view(-1)[3] = float("nan")
    return Payload(
        files={"model.safetensors": model, "optimizer.safetensors": optim, "rng.safetensors": rng},
        meta={"cells": 2, "layout": {"tp": 1, "pp": 1}, "config_hash": "abc"},
        fingerprint_prefixes=PREFIXES,
    )


def log_fingerprints(run: Path) -> None:
    """Log, as the driver and a trainer of ``run`` would have, the ``checkpoint_published`` of each
    checkpoint (the last one keeping what retention.json records) and the committed
    ``state_fingerprint`` of its step (cell 0 rank 0, the manifest's total and entries), so
    ``verify-checkpoint RUN`` (and ``--resume``) can cross-check the checkpoints with the event log."""
    import hashlib
    import json

    from ftkit.events.writer import EventWriter

    ckpts = sorted(d for d in (run / "checkpoints").glob("step_*") if (d / "MANIFEST.json").is_file())
    recorded = json.loads((run / "checkpoints" / "retention.json").read_text())["records"]
    with EventWriter(run / "events", run=run.name, role="driver") as driver:  # and each publication
        for d in ckpts:
            raw = (d / "MANIFEST.json").read_bytes()
            man = json.loads(raw)
            driver.emit("checkpoint_published", step=man["step"], path=str(d), kind="latest",
                        metric=man["metric"]["value"], manifest_sha256=hashlib.sha256(raw).hexdigest(),
                        guard_from_step=man["guard"]["from_step"], guard_to_step=man["guard"]["to_step"],
                        bytes=sum(f["size"] for f in man["files"].values()),
                        kept=[r["name"] for r in recorded], dropped=[])  # fmt: skip
    with EventWriter(run / "events", run=run.name, role="trainer", cell=0, rank=0) as w:
        for d in sorted((run / "checkpoints").glob("step_*")):
            man = json.loads((d / "MANIFEST.json").read_text())
            params, optimizer = logged_entries(man)
            w.emit("state_fingerprint", rollout=man["rollout"] or 0, step=man["step"], attempt=0, cell=0, rank=0,
                   total=man["state_fingerprint"], params=params, optimizer=optimizer)  # fmt: skip


def logged_entries(man: dict) -> tuple[dict[str, str], dict[str, str]]:
    """The per-tensor ``params`` / ``optimizer`` entries a TP=1/PP=1 rank logs in the
    ``state_fingerprint`` of a checkpoint's step: the manifest's (parsed) tensor fingerprints of
    its ``param/`` and ``optimizer/`` groups, so the line's total is the manifest's."""
    out: dict[str, dict[str, str]] = {"param/": {}, "optimizer/": {}}
    for fname, prefix in man["fingerprint_prefixes"].items():
        out[prefix].update({n: t["fingerprint"] for n, t in man["files"][fname]["tensors"].items()})
    return out["param/"], out["optimizer/"]


def publish(publisher, step: int, metric: float | None = 0.5, at=None, guard=None, **kw):  # noqa: ANN001, ANN201
    """Preflight one rank, agree, publish; returns the Outcome."""
    from ftkit.checkpoint.guard import GuardVerdict
    from ftkit.checkpoint.preflight import agree, preflight

    p = kw.pop("payload", None) or payload(step)
    publisher.at = at
    gv = guard or GuardVerdict(max(0, step - 3), step, False)
    verdict = agree([preflight(publisher.dir, step, p.nbytes, gv, "cell0-rank0", at=at)])
    return publisher.publish(step, p, gv, verdict, metric=metric, rollout=step // 4)


def _main(root: str, point: str, n: int) -> None:
    from ftkit.checkpoint.journal import reconcile
    from ftkit.checkpoint.publish import Publisher
    from ftkit.checkpoint.retention import RetentionPolicy, load_records

    pub = Publisher(Path(root), RetentionPolicy(keep_last=1, keep_best=1))
    reconcile(pub.dir)  # what a resumed run does first
    records, _ = load_records(pub.dir)
    step = max((r.step + 4 for r in records), default=0)
    for i in range(n):
        publish(pub, step, metric=float(i % 3), payload=payload(step, torch_tensors=False))
        step += 4
    if point == "loop":
        print("ready", flush=True)
        while True:
            publish(pub, step, metric=float(step % 5), payload=payload(step, scale=64, torch_tensors=False))
            step += 4

    def hook(p: str) -> None:
        if p == point:
            os.kill(os.getpid(), signal.SIGKILL)

    pub.at = hook
    publish(pub, step, metric=0.0, at=hook, payload=payload(step, torch_tensors=False))
    sys.exit(17)  # not reached when the hook fired


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
