"""Adoption cost of the evidence API (issue 23): an instrumented DDP loop vs the same loop without ftkit.

Two ranks (gloo, CPU, one thread each) train the same MLP on the same batches, in short blocks of
``--steps`` steps that alternate between the plain loop and the loop instrumented as in
examples/ddp_train.py at the default cadence (``EvidenceProfile()``: step outcome, state
fingerprint, sample witnesses and the loss at every step (rank 0's own: averaging it over the ranks
is the loop's choice, not ftkit's), the non-finite guard before every optimizer step). Each step
trains ids no step trained before, all of them allocated once up front, as an epoch would. Only
steady-state steps are timed: the process group, the ``EvidenceRun`` (run directory, ``run.json``,
the allocation) and two warm-up steps of each loop come before the first block, and every block
runs between two barriers. The blocks come in ``--pairs`` pairs, ordered ABBA (plain first in even
pairs, ftkit first in odd ones), so a drift in the machine's load hits both loops alike; each pair
gives two ratios, plain over instrumented:

- wall time of rank 0's block, i.e. steps/s instrumented over plain (the target: >= 0.97);
- CPU time of both ranks' blocks (``time.process_time``: every thread of both processes, gloo's and
  the event writer's background fsync included), which waiting for other jobs does not distort.

Blocks are one step by default: the finer the interleaving, the less of the machine's drift lands
between the two halves of a pair. Each pair is followed by an **A/A control pair**: two blocks of
the plain loop, timed and ordered the same way. Its median ratio would be 1.0 on a quiet machine;
how far it is from 1.0 is the noise floor of this run, measured on the same machine at the same
time. It prints the median and quartiles of all three over the pairs, the CPU time the ftkit calls
themselves took on the training thread per step and the ratio that alone would give, the ratio of
the fastest blocks (other jobs only ever add time), the load average before and after, and a
verdict (``verdict_of``): PASS when both medians are >= 0.97 and the control is within the margin
(1.0 +- 0.03); FAIL when the CPU median misses, or the steps/s one does with its quartiles below;
otherwise INCONCLUSIVE (the machine was too noisy to tell). Then the cost of each evidence kind
per call, timed alone on the same state (median wall and training-thread CPU time of ``--repeat``
calls), also as a share of the median plain step. Usage::

    python bench/evidence_overhead.py             # defaults: 1.6M-parameter MLP, 64 pairs of 1 step (~2 min)
    python bench/evidence_overhead.py --quick     # 12 pairs, 5 calls per kind, no dump or checkpoint (~30 s)
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

TARGET = 0.97


def _model(hidden: int, layers: int) -> Any:
    import torch

    torch.manual_seed(0)
    mods: list[Any] = [torch.nn.Linear(64, hidden), torch.nn.GELU()]
    for _ in range(layers):
        mods += [torch.nn.Linear(hidden, hidden), torch.nn.GELU()]
    return torch.nn.Sequential(*mods, torch.nn.Linear(hidden, 1))


def _timed(fn: Any, repeat: int) -> tuple[float, float]:
    """(median wall seconds, median CPU seconds of this thread) of ``repeat`` calls of ``fn``."""
    walls, cpus = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.thread_time()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.thread_time() - c0)
    return statistics.median(walls), statistics.median(cpus)


def _block(fn: Any, steps: int) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) of ``steps`` calls, between two barriers."""
    import torch.distributed as dist

    dist.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        fn()
    dist.barrier()
    return time.perf_counter() - t0, time.process_time() - c0


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    return tuple(statistics.quantiles(values, n=4)) if len(values) > 1 else (values[0],) * 3  # type: ignore[return-value]


def verdict_of(wall: float, wall_q1: float, wall_q3: float, cpu: float, control: float) -> str:
    """PASS when the medians of both ratios reach ``TARGET`` and the A/A control's median is within
    the margin of 1.0 (``1 - TARGET``: the run could tell a 3% cost from none); FAIL when the
    CPU-time one does not, or the steps/s one does not and its quartiles lie below it (not noise);
    otherwise INCONCLUSIVE: the steps/s quartiles straddle the target, or the control shows the
    machine noisier than the margin (rerun on a quieter machine or with more pairs)."""
    if cpu < TARGET:
        return f"FAIL (CPU-time ratio {cpu:.3f} < {TARGET})"
    if wall < TARGET and wall_q3 < TARGET:
        return f"FAIL (steps/s ratio {wall:.3f}, quartiles {wall_q1:.3f} .. {wall_q3:.3f})"
    if abs(control - 1.0) > 1.0 - TARGET:
        return f"INCONCLUSIVE (the A/A control reads {control:.3f}: this run's noise exceeds the margin)"
    if wall >= TARGET:
        return "PASS"
    return f"INCONCLUSIVE (steps/s median {wall:.3f} < {TARGET} within quartiles {wall_q1:.3f} .. {wall_q3:.3f})"


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
    x, y = data[rank * args.batch : (rank + 1) * args.batch], target[rank * args.batch : (rank + 1) * args.batch]
    per_step = args.batch * world
    run = ftkit.EvidenceRun(Path(out) / "run", ftkit.EvidenceProfile())
    run.allocate(0, range((2 + args.pairs * args.steps) * per_step))  # every step trains new ids
    step = 0
    inline = [0.0]  # training-thread CPU seconds inside ftkit calls, this block

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
        c0 = time.thread_time()
        run.observe_grads(step, model)
        inline[0] += time.thread_time() - c0
        opt.step()
        first = step * per_step + rank * args.batch
        samples = range(first, first + args.batch)  # the loop's sampler gives these anyway
        c0 = time.thread_time()
        run.step(step, model=model, optimizer=opt, samples=samples, metrics={"loss": loss})
        inline[0] += time.thread_time() - c0
        step += 1

    for _ in range(2):
        plain()
        instrumented()
    load_before = os.getloadavg()[0]
    pairs: list[dict[str, tuple[float, float]]] = []
    inline_s = 0.0
    controls: list[dict[str, tuple[float, float]]] = []
    for pair in range(args.pairs):
        order = (("plain", plain), ("ftkit", instrumented))
        inline[0] = 0.0
        pairs.append({name: _block(fn, args.steps) for name, fn in (order if pair % 2 == 0 else order[::-1])})
        inline_s += inline[0]
        control = (("a", plain), ("b", plain))
        controls.append({name: _block(fn, args.steps) for name, fn in (control if pair % 2 == 0 else control[::-1])})
    load_after = os.getloadavg()[0]
    cpu = gather_json([[p["plain"][1], p["ftkit"][1]] for p in pairs])  # every rank's CPU seconds per pair
    kinds = {
        "step_outcome": lambda: run.step_outcome(10**6),
        "state_fingerprint": lambda: run.fingerprint(10**6, model, opt),
        "witness_counts (start + wait, not overlapped)": lambda: run.witness_counts(10**6, range(args.batch)),
        "metric (rank 0)": lambda: run.metric(10**6, loss=1.0),
        "non-finite guard": lambda: run.observe_grads(10**6, model),
    }
    costs = {kind: _timed(fn, args.repeat) for kind, fn in kinds.items()}
    if not args.quick:
        costs["dump (all outputs + grads)"] = _timed(lambda: _dumped(run, model, x, y), max(3, args.repeat // 4))
        costs["checkpoint (guarded publication)"] = _timed(lambda: _published(run, model, opt), 3)
    if rank == 0:
        wall = sorted(p["plain"][0] / p["ftkit"][0] for p in pairs)
        cpus = sorted(sum(r[i][0] for r in cpu) / sum(r[i][1] for r in cpu) for i in range(len(pairs)))
        (wq1, wmed, wq3), (cq1, cmed, cq3) = _quartiles(wall), _quartiles(cpus)
        aq1, amed, aq3 = _quartiles(sorted(c["a"][0] / c["b"][0] for c in controls))
        n = args.pairs * args.steps
        plain_wall = sum(p["plain"][0] for p in pairs)
        ftkit_wall = sum(p["ftkit"][0] for p in pairs)
        plain_step = statistics.median(p["plain"][0] for p in pairs) / args.steps
        inline_step = inline_s / n
        params = sum(p.numel() for p in model.parameters())
        print(f"{world} ranks, gloo, MLP of {params / 1e6:.2f}M parameters, batch {args.batch} per rank")
        print(f"{args.pairs} ABBA pairs of {args.steps}-step blocks; load {load_before:.1f} -> {load_after:.1f}")
        print(f"plain loop:        {n / plain_wall:8.3f} steps/s (median step {plain_step * 1e3:.0f} ms)")
        print(f"instrumented loop: {n / ftkit_wall:8.3f} steps/s")
        print(f"steps/s ratio, median of pairs: {wmed:.3f} (quartiles {wq1:.3f} .. {wq3:.3f})")
        print(f"CPU-time ratio, both ranks, median of pairs: {cmed:.3f} (quartiles {cq1:.3f} .. {cq3:.3f})")
        print(f"A/A control (plain over plain), median of pairs: {amed:.3f} (quartiles {aq1:.3f} .. {aq3:.3f})")
        print(
            f"ftkit calls on the training thread: {inline_step * 1e3:.2f} ms CPU per step, "
            f"alone a ratio of {plain_step / (plain_step + inline_step):.3f}"
        )
        fastest = min(p["plain"][0] for p in pairs) / min(p["ftkit"][0] for p in pairs)
        print(f"  fastest plain block over fastest instrumented block: {fastest:.3f}")
        print(f"  (pooled wall time: {plain_wall / ftkit_wall:.3f})")
        print(f"{verdict_of(wmed, wq1, wq3, cmed, amed)} against {TARGET}")
        share = f"share of a plain step ({plain_step * 1e3:.0f} ms)"
        print(f"\n| evidence kind | ms per call, wall | ms CPU (training thread) | {share} |")
        print("|---|---|---|---|")
        for kind, (wall_s, cpu_s) in costs.items():
            print(f"| {kind} | {wall_s * 1e3:.2f} | {cpu_s * 1e3:.2f} | {wall_s / plain_step:.1%} |")
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
    p.add_argument("--steps", type=int, default=1, help="steps per block")
    p.add_argument("--pairs", type=int, default=64, help="ABBA pairs of blocks, each with a control pair")
    p.add_argument("--repeat", type=int, default=20, help="calls timed per evidence kind")
    p.add_argument("--quick", action="store_true", help="12 pairs, 5 calls per kind, no dump or checkpoint")
    args = p.parse_args()
    if args.quick:
        args.pairs, args.repeat = min(args.pairs, 12), min(args.repeat, 5)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="ftkit-bench-") as out:
        mp.spawn(_rank, args=(2, port, args, out), nprocs=2, join=True)


if __name__ == "__main__":
    main()
