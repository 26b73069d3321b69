"""Adoption cost of the evidence API (issue 23): an instrumented DDP loop vs the same loop without ftkit.

Two ranks (gloo, CPU, one thread each) train the same MLP on the same batches, in blocks that
alternate between the plain loop and the loop instrumented as in examples/ddp_train.py at the
default cadence (``EvidenceProfile()``: step outcome, state fingerprint, sample witnesses and the
loss at every step (rank 0's own: averaging it over the ranks is the loop's choice, not ftkit's), the
non-finite guard before every optimizer step), so drift in the machine's
load hits both alike. It prints steps/s of each, their ratio (target >= 0.97), and then the cost
of each evidence kind per call, timed alone on the same state (median of ``--repeat``), also as a
share of the plain step. Usage::

    python bench/evidence_overhead.py                       # defaults: 1.6M-parameter MLP, 10 steps a block
    python bench/evidence_overhead.py --hidden 256 --steps 20
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


def _timed(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ftkit

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

    for _ in range(3):
        plain()
        instrumented()
    spent = {"plain": 0.0, "ftkit": 0.0}
    for _ in range(args.blocks):
        for name, fn in (("plain", plain), ("ftkit", instrumented)):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                fn()
            dist.barrier()
            spent[name] += time.perf_counter() - t0
    n = args.blocks * args.steps
    costs = {
        "step_outcome": _timed(lambda: run.step_outcome(10**6), args.repeat),
        "state_fingerprint": _timed(lambda: run.fingerprint(10**6, model, opt), args.repeat),
        "witness_counts": _timed(lambda: run.witness_counts(10**6, ids), args.repeat),
        "metric (rank 0)": _timed(lambda: run.metric(10**6, loss=1.0), args.repeat),
        "non-finite guard": _timed(lambda: run.observe_grads(10**6, model), args.repeat),
        "dump (all outputs + grads)": _timed(lambda: _dumped(run, model, x, y), max(3, args.repeat // 4)),
        "checkpoint (guarded publication)": _timed(lambda: _published(run, model, opt), 3),
    }
    plain_step = spent["plain"] / n
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(f"{world} ranks, gloo, MLP of {params / 1e6:.2f}M parameters, batch {args.batch} per rank")
        print(f"plain loop:        {n / spent['plain']:8.2f} steps/s")
        print(f"instrumented loop: {n / spent['ftkit']:8.2f} steps/s")
        print(f"ratio (target >= 0.97): {spent['plain'] / spent['ftkit']:.3f}")
        print(f"\n| evidence kind | ms per call | share of a plain step ({plain_step * 1e3:.1f} ms) |")
        print("|---|---|---|")
        for kind, sec in costs.items():
            print(f"| {kind} | {sec * 1e3:.2f} | {sec / plain_step:.1%} |")
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
    p.add_argument("--steps", type=int, default=10, help="steps per block")
    p.add_argument("--blocks", type=int, default=4, help="blocks of each loop, alternating")
    p.add_argument("--repeat", type=int, default=20, help="calls timed per evidence kind")
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="ftkit-bench-") as out:
        mp.spawn(_rank, args=(2, port, args, out), nprocs=2, join=True)


if __name__ == "__main__":
    main()
