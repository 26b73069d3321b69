"""Adoption cost of the evidence API (issue 23): an instrumented DDP loop vs the same loop without ftkit.

Two ranks (gloo, CPU, one thread each) train the same MLP on the same batches, in short blocks of
``--steps`` steps that alternate between the plain loop and the loop instrumented as in
examples/ddp_train.py at the default cadence (``EvidenceProfile()``: step outcome, state
fingerprint, sample witnesses and the loss at every step (rank 0's own: averaging it over the ranks
is the loop's choice, not ftkit's), the non-finite guard before every optimizer step). The blocks
come in ``--pairs`` pairs, ordered ABBA (plain first in even pairs, ftkit first in odd ones), so a
drift in the machine's load hits both loops alike, and each pair gives one ratio (plain block time
over instrumented block time, i.e. steps/s instrumented over plain). It prints:

- the median of the pair ratios (the figure; target >= 0.97), its quartiles and extremes (the
  noise: on a shared machine single pairs swing by several percent either way);
- the same ratio of the CPU time the two ranks spent (``time.process_time``, every thread of both
  processes): less sensitive to other jobs on the machine than wall time, since waiting is not counted;
- the machine's load average before and after (a measurement under load is a measurement of the load);
- the cost of each evidence kind per call, timed alone on the same state (median and fastest of
  ``--repeat`` calls), the median also as a share of the median plain step. Usage::

    python bench/evidence_overhead.py                       # defaults: 1.6M-parameter MLP, 16 pairs of 4 steps
    python bench/evidence_overhead.py --hidden 256 --pairs 30
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def _model(hidden: int, layers: int) -> Any:
    import torch

    torch.manual_seed(0)
    mods: list[Any] = [torch.nn.Linear(64, hidden), torch.nn.GELU()]
    for _ in range(layers):
        mods += [torch.nn.Linear(hidden, hidden), torch.nn.GELU()]
    return torch.nn.Sequential(*mods, torch.nn.Linear(hidden, 1))


def _timed(fn: Any, repeat: int) -> tuple[float, float]:
    """(median, fastest) seconds of ``repeat`` calls of ``fn``."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times)


def _block(fn: Any, steps: int) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) of ``steps`` calls, between two barriers."""
    import torch.distributed as dist

    dist.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        fn()
    dist.barrier()
    return time.perf_counter() - t0, time.process_time() - c0


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ftkit
    from ftkit.evidence.collectives import gather_json

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    model = DDP(_model(args.hidden, args.layers))
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    data = torch.randn(args.batch * world, 64)
    target = data.sum(1, keepdim=True)
    ids = list(range(rank * args.batch, (rank + 1) * args.batch))
    x, y = data[ids], target[ids]
    run = ftkit.EvidenceRun(Path(out) / "run", ftkit.EvidenceProfile())
    run.allocate(0, range(10**7))  # witness accounting is not what is timed here
    step = 0

    def plain() -> Any:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    def instrumented() -> None:
        nonlocal step
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        run.observe_grads(step, model)
        opt.step()
        run.step(step, model=model, optimizer=opt, samples=[i + step * 1000 for i in ids], metrics={"loss": loss})
        step += 1

    for _ in range(2):
        plain()
        instrumented()
    load_before = os.getloadavg()[0]
    pairs: list[dict[str, tuple[float, float]]] = []
    for pair in range(args.pairs):
        order = (("plain", plain), ("ftkit", instrumented))
        timed = {name: _block(fn, args.steps) for name, fn in (order if pair % 2 == 0 else order[::-1])}
        pairs.append(timed)
    load_after = os.getloadavg()[0]
    cpu = gather_json([[p["plain"][1], p["ftkit"][1]] for p in pairs])  # both ranks' CPU seconds
    costs = {
        "step_outcome": _timed(lambda: run.step_outcome(10**6), args.repeat),
        "state_fingerprint": _timed(lambda: run.fingerprint(10**6, model, opt), args.repeat),
        "witness_counts (start + wait, not overlapped)": _timed(lambda: run.witness_counts(10**6, ids), args.repeat),
        "metric (rank 0)": _timed(lambda: run.metric(10**6, loss=1.0), args.repeat),
        "non-finite guard": _timed(lambda: run.observe_grads(10**6, model), args.repeat),
        "dump (all outputs + grads)": _timed(lambda: _dumped(run, model, x, y), max(3, args.repeat // 4)),
        "checkpoint (guarded publication)": _timed(lambda: _published(run, model, opt), 3),
    }
    if rank == 0:
        ratios = sorted(p["plain"][0] / p["ftkit"][0] for p in pairs)
        q1, med, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
        plain_wall = sum(p["plain"][0] for p in pairs)
        ftkit_wall = sum(p["ftkit"][0] for p in pairs)
        cpu_plain = sum(c[0] for r in cpu for c in r)
        cpu_ftkit = sum(c[1] for r in cpu for c in r)
        n = args.pairs * args.steps
        plain_step = statistics.median(p["plain"][0] for p in pairs) / args.steps
        params = sum(p.numel() for p in model.parameters())
        print(f"{world} ranks, gloo, MLP of {params / 1e6:.2f}M parameters, batch {args.batch} per rank")
        print(f"{args.pairs} ABBA pairs of {args.steps}-step blocks; load {load_before:.1f} -> {load_after:.1f}")
        print(f"plain loop:        {n / plain_wall:8.3f} steps/s")
        print(f"instrumented loop: {n / ftkit_wall:8.3f} steps/s")
        print(f"ratio, median of pairs (target >= 0.97): {med:.3f}")
        print(f"  noise: quartiles {q1:.3f} .. {q3:.3f}, extremes {ratios[0]:.3f} .. {ratios[-1]:.3f}")
        print(f"  pooled wall time: {plain_wall / ftkit_wall:.3f}; CPU time of both ranks: {cpu_plain / cpu_ftkit:.3f}")
        step_ms = f"{plain_step * 1e3:.0f} ms"
        print(f"\n| evidence kind | ms per call, median | fastest | share of a plain step ({step_ms}) |")
        print("|---|---|---|---|")
        for kind, (med_s, min_s) in costs.items():
            print(f"| {kind} | {med_s * 1e3:.2f} | {min_s * 1e3:.2f} | {med_s / plain_step:.1%} |")
    run.close()
    dist.destroy_process_group()


_calls = [2 * 10**6]


def _dumped(run: Any, model: Any, x: Any, y: Any) -> None:
    import torch

    _calls[0] += 1
    with run.dump(_calls[0], model.module):
        torch.nn.functional.mse_loss(model(x), y).backward()


def _published(run: Any, model: Any, opt: Any) -> None:
    _calls[0] += 1
    run.publish_checkpoint(_calls[0], model, opt)


def main() -> None:
    import socket

    import torch.multiprocessing as mp

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--batch", type=int, default=2048, help="samples per rank and step")
    p.add_argument("--steps", type=int, default=4, help="steps per block")
    p.add_argument("--pairs", type=int, default=16, help="ABBA pairs of blocks (plain, instrumented)")
    p.add_argument("--repeat", type=int, default=20, help="calls timed per evidence kind")
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="ftkit-bench-") as out:
        mp.spawn(_rank, args=(2, port, args, out), nprocs=2, join=True)


if __name__ == "__main__":
    main()
