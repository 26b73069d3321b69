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
The two cell runs alternate ``--repeats`` times and the best rate of each is kept, since the
machine may be shared.

    python bench/train_overhead.py                    # tiny model, 2 cells
    python bench/train_overhead.py --model small --cells 2 --json
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


def cell_rate(base: dict, out: Path, bookkeeping: bool) -> tuple[float, Path]:
    """Steps/s of one ``run_training`` (steps after the first rollout), and its run dir."""
    from ftkit.train.config import TrainConfig
    from ftkit.train.driver import run_training

    cfg = TrainConfig(**base, out=out, overwrite=True, bookkeeping=bookkeeping,
                      reduce="exact" if bookkeeping else "float", dump_rollouts="none")
    seconds: list[float] = []
    run_training(cfg, on_step=lambda r: seconds.append(r.seconds) if r.rollout > 0 else None)
    return len(seconds) / sum(seconds), out


def plain_rate(base: dict, run_dir: Path) -> float:
    """Steps/s of a single-process megatron-core loop over the rollouts recorded in ``run_dir``."""
    import torch

    from ftkit.model.gpt import build_gpt, configure_determinism, init_local_parallel
    from ftkit.train import rollouts
    from ftkit.train.config import TrainConfig
    from ftkit.train.loss import pg_loss, step_tokens, targets

    cfg = TrainConfig(**base)
    configure_determinism(cfg.threads_per_rank)
    init_local_parallel("cpu")
    model = build_gpt(cfg, "cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0, foreach=False)
    n = cfg.step_samples
    seconds = []
    for r in range(cfg.rollouts):
        batch = rollouts.load(rollouts.rollout_path(run_dir, r))
        for k in range(cfg.steps_per_rollout):
            part = {key: v[k * n:(k + 1) * n] for key, v in batch.items()}
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", choices=["tiny", "small"])
    ap.add_argument("--cells", type=int, default=2)
    ap.add_argument("--rollouts", type=int, default=4, help="the first one is warm-up")
    ap.add_argument("--steps-per-rollout", type=int, default=4)
    ap.add_argument("--samples-per-rollout", type=int, default=64)
    ap.add_argument("--micro-shards", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    import ray

    from ftkit.train.driver import LOCAL_RAY_CPUS

    base = dict(model=args.model, cells=args.cells, rollouts=args.rollouts, steps_per_rollout=args.steps_per_rollout,
                samples_per_rollout=args.samples_per_rollout, micro_shards=args.micro_shards, seed=0)
    ray.init(num_cpus=LOCAL_RAY_CPUS, include_dashboard=False, log_to_driver=False)
    ft, nobook = [], []
    with tempfile.TemporaryDirectory(prefix="ftkit-bench-") as tmp:
        try:
            for i in range(args.repeats):
                rate, ft_dir = cell_rate(base, Path(tmp) / "ft", True)
                ft.append(rate)
                nobook.append(cell_rate(base, Path(tmp) / "nobook", False)[0])
                print(f"repeat {i + 1}/{args.repeats}: ft {ft[-1]:.2f} steps/s, no-bookkeeping "
                      f"{nobook[-1]:.2f} steps/s", file=sys.stderr)
        finally:
            ray.shutdown()
        plain = plain_rate(base, ft_dir)
    best_ft, best_nb = max(ft), max(nobook)
    doc = {
        "schema_version": 1, "config": base, "repeats": args.repeats,
        "steps_per_s": {"ft": best_ft, "no_bookkeeping": best_nb, "plain": plain},
        "all_runs": {"ft": ft, "no_bookkeeping": nobook},
        "ratio_ft_over_no_bookkeeping": best_ft / best_nb,
        "ratio_ft_over_plain": best_ft / plain,
        "median_ratio_ft_over_no_bookkeeping": statistics.median(a / b for a, b in zip(ft, nobook)),
    }
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"model {args.model}, {args.cells} cell(s), {args.samples_per_rollout // args.steps_per_rollout} "
              f"samples per step, {args.micro_shards} micro-shards")
        print(f"  ft (exact reduction, witness, fingerprints, events): {best_ft:8.2f} steps/s")
        print(f"  same cells, bookkeeping off (float all-reduce):      {best_nb:8.2f} steps/s")
        print(f"  plain single-process megatron-core loop:             {plain:8.2f} steps/s")
        print(f"  ft / no-bookkeeping = {doc['ratio_ft_over_no_bookkeeping']:.3f}   (target >= 0.95)")
        print(f"  ft / plain          = {doc['ratio_ft_over_plain']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
