"""The exact reduction against the float one, on the same gradient rows (issue 36, item 3).

One process, no collective (a single cell: the all-reduces are the identity), so what is timed is
the kernels: ``ExactReducer.reduce`` (the exponents, the int64 quantised sums, the result) and
``reduce_float`` (the float32 sum of the rows) on ``k`` micro-shard rows of the gradient layout of
a SmolLM2-135M-shaped Llama (134.5M parameters: 49152 x 576 embedding, 30 layers of attention
576 / 192 and MLP 1536, norms), or ``--scale``d down. Kernels: ``numpy`` (what a CPU rank runs)
and ``fused`` (``ftkit.train.rank.exact_kernels``: what a CUDA rank runs; on CPU through
``torch.compile``'s C++ backend). The first call of each is warm-up (the fused kernels compile
then). It prints the median of ``--repeat`` calls of each and the ratio exact / float (target on
CUDA: <= 2), and checks that both kernel sets give the same bits. Usage::

    python bench/exact_reduce.py                          # CPU, 8 micro-shards, 1/4 of the model
    python bench/exact_reduce.py --device cuda --scale 1  # where a GPU is lent
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any


def layout_shapes(scale: float) -> list[tuple[str, tuple[int, ...]]]:
    """The parameter shapes of a SmolLM2-135M-shaped Llama, the layer count times ``scale``."""
    hidden, kv, ffn, vocab = 576, 192, 1536, 49152
    shapes: list[tuple[str, tuple[int, ...]]] = [("embedding", (vocab, hidden))]
    for i in range(max(1, round(30 * scale))):
        p = f"layers.{i}."
        shapes += [(p + "input_norm", (hidden,)), (p + "qkv", (hidden + 2 * kv, hidden))]
        shapes += [(p + "proj", (hidden, hidden)), (p + "mlp_norm", (hidden,))]
        shapes += [(p + "fc1", (2 * ffn, hidden)), (p + "fc2", (hidden, ffn))]
    return [*shapes, ("final_norm", (hidden,))]


def timed(fn: Any, repeat: int, sync: Any) -> float:
    fn()  # warm-up (compiles the fused kernels)
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    import torch

    from ftkit.train.rank.reducer import ExactReducer, GradLayout, reduce_float

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--micro-shards", type=int, default=8, help="rows k (micro-shards of one cell)")
    parser.add_argument("--scale", type=float, default=0.25, help="fraction of the 30 layers (1: the whole model)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads on CPU (a rank's default)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    layout = GradLayout.of(layout_shapes(args.scale))
    rows = torch.randn(args.micro_shards, layout.numel, generator=torch.Generator().manual_seed(0)).to(dev)

    def identity(t: Any, op: str) -> None:
        return None

    float_s = timed(lambda: reduce_float(rows, identity), args.repeat, sync)
    print(f"{layout.numel / 1e6:.1f}M parameters x {args.micro_shards} rows on {dev.type}")
    print(f"  float reduction        {float_s * 1e3:9.1f} ms")
    results = {}
    kernel_sets = ("numpy", "fused") if dev.type == "cpu" else ("fused",)
    for name in kernel_sets:
        reducer = ExactReducer(layout, args.micro_shards, numpy_kernels=name == "numpy")
        s = timed(lambda r=reducer: r.reduce(rows, identity), args.repeat, sync)
        results[name] = reducer.reduce(rows, identity).cpu().numpy().tobytes()
        print(f"  exact, {name:6s} kernels {s * 1e3:9.1f} ms   exact / float {s / float_s:5.2f}x")
    if len(results) == 2:
        print("  same bits:", results["numpy"] == results["fused"])


if __name__ == "__main__":
    main()
