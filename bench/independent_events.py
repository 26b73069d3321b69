"""An event log generator independent of ftkit's writer, for benchmarking ``analyze-events``.

``ftkit.testing.synthetic`` writes through ``EventWriter`` (orjson, ftkit's key order, no
spaces), so a bench over its logs measures only inputs ftkit wrote itself. This script follows
docs/event-schema.md on its own: every line is ``json.dumps`` of a dict built here, with the
payload fields first and the envelope last, the json module's default separators (``", "`` and
``": "``), sources with their keys in another order, and its own file names. What it shares
with ftkit is the definition of a fingerprint total (``ftkit.tensors.fingerprint``: the
documented function of the per-tensor entries, which the analyzer recomputes).

The run: a driver, ``cells x tp x pp`` trainer ranks and ``engines`` engines; each rollout
allocates its samples, sends weights to every engine and trains ``steps`` steps (one
``step_outcome``, ``state_fingerprint`` of ``tensors`` tensors and ``witness_counts`` per rank,
a driver ``metric`` per step). ``faults`` kills the last live cell's processes mid-step: the
survivors fail the attempt, the driver declares the cell errored and reconfigures, the step is
retried (attempt 1) and commits; two steps later the cell restarts (a new incarnation), heals
from a donor and rejoins. Every stream but a killed one ends with ``log_closed``. Usage::

    python bench/independent_events.py OUT_DIR --events 300000 --cells 4 --tensors 20
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
from pathlib import Path
from typing import Any

from ftkit.tensors.fingerprint import combine, state_total


class Stream:
    """One process's file: the envelope and its ``seq`` added here, payload first."""

    def __init__(self, root: Path, name: str, source: dict[str, Any], run: str) -> None:
        self.fh = open(root / f"{name}.jsonl", "w", buffering=1 << 20)  # noqa: SIM115 - closed by close()
        self.source, self.run, self.seq = source, run, 0

    def write(self, now: float, type_: str, **payload: Any) -> None:
        line = {"type": type_, **payload, "time": now, "run": self.run, "seq": self.seq, "source": self.source}
        line["schema"] = 2
        self.fh.write(json.dumps(line) + "\n")
        self.seq += 1

    def close(self, now: float, declare: bool = True) -> None:
        if declare:
            self.write(now, "log_closed", lines=self.seq, dropped=0)
        self.fh.close()


def _digest(*parts: Any) -> str:
    return hashlib.blake2b(repr(parts).encode(), digest_size=16).hexdigest()


class Run:
    def __init__(self, root: Path, args: argparse.Namespace) -> None:
        self.root, self.args, self.now, self.epoch = root, args, 1.8e9, 0
        root.mkdir(parents=True, exist_ok=True)
        self.ranks = args.tp * args.pp
        self.names = [f"layers.{i // 4}.t{i % 4}.weight" for i in range(args.tensors)]
        self.driver = self._stream("drv", {"host": "ctl", "pid": 1, "role": "driver", "incarnation": 0})
        self.engines = [
            self._stream(f"eng{e}", {"rank": e, "host": f"gpu{e}", "pid": 100 + e, "role": "engine", "incarnation": 0})
            for e in range(args.engines)
        ]
        self.incarnation: dict[int, int] = {}
        self.ranks_of: dict[int, list[Stream]] = {}
        self.alive: list[int] = []

    def tick(self) -> float:
        self.now += 0.0007
        return self.now

    def _stream(self, name: str, source: dict[str, Any]) -> Stream:
        source = {"cell": None, "rank": None, **source}
        return Stream(self.root, name, source, self.args.run)

    def _start(self, cell: int) -> None:
        inc = self.incarnation[cell] = self.incarnation.get(cell, -1) + 1
        self.ranks_of[cell] = [
            self._stream(
                f"c{cell}.r{rank}.i{inc}",
                {"pid": 1000 + 100 * cell + rank + 10_000 * inc, "cell": cell, "rank": rank, "incarnation": inc},
            )
            for rank in range(self.ranks)
        ]
        for s in self.ranks_of[cell]:
            s.source.update(role="trainer", host=f"node{cell}")

    def state(self, cell: int, old: str, new: str, reason: str) -> None:
        self.driver.write(self.tick(), "cell_state", cell=cell, old=old, new=new, reason=reason)

    def reconfigure(self, alive: list[int], reason: str) -> None:
        before, self.alive = self.alive, sorted(alive)
        self.driver.write(
            self.tick(), "reconfigure", epoch=self.epoch, alive_before=before, alive_after=self.alive, reason=reason
        )

    def fingerprint(self, step: int, rank: int) -> tuple[str, dict[str, str], dict[str, str]]:
        stage = rank // self.args.tp
        mine = self.names[stage :: self.args.pp]
        params = {n: _digest("p", step, rank % self.args.tp, n) for n in mine}
        opt = {n: _digest("o", step, rank % self.args.tp, n) for n in mine}
        return state_total(params, opt), params, opt

    def run(self, rollouts: int, faults: set[int]) -> None:
        a, d = self.args, self.driver
        d.write(
            self.tick(),
            "run_started",
            num_cells=a.cells,
            tp=a.tp,
            pp=a.pp,
            num_engines=a.engines,
            ftkit_version="independent",
            config={"generator": "bench/independent_events.py"},
        )
        for cell in range(a.cells):
            self.state(cell, "pending", "starting", "launch")
            self._start(cell)
            self.state(cell, "starting", "alive", "ready")
        self.reconfigure(list(range(a.cells)), "start")
        heal_at: dict[int, int] = {}
        samples = a.steps * 8
        for rollout in range(rollouts):
            ids = list(range(rollout * samples, (rollout + 1) * samples))
            d.write(self.tick(), "witness_allocated", rollout=rollout, attempt=0, ids=ids, expected=1)
            weights = {n: _digest("w", rollout, n) for n in self.names}
            total = combine(weights)
            d.write(self.tick(), "weights_sent", rollout=rollout, version=rollout, total=total, params=weights)
            for e, s in enumerate(self.engines):
                s.write(
                    self.tick(),
                    "engine_weights",
                    engine=e,
                    rollout=rollout,
                    version=rollout,
                    total=total,
                    params=weights,
                )
            for k in range(a.steps):
                step = rollout * a.steps + k
                for cell, at in sorted(heal_at.items()):
                    if at == step:
                        del heal_at[cell]
                        self._heal(cell, step)
                attempt = 0
                if step in faults and len(self.alive) > 1:
                    attempt = self._fault(rollout, step)
                    heal_at[self.alive_lost] = step + 2
                self._commit(rollout, step, attempt, ids[k * 8 : (k + 1) * 8])
        for cell in self.alive:
            self.state(cell, "alive", "stopped", "run end")
        d.write(self.tick(), "run_finished", status="completed", reason=None)
        for streams in self.ranks_of.values():
            for s in streams:
                s.close(self.tick())
        for s in [*self.engines, d]:
            s.close(self.tick())

    def _fault(self, rollout: int, step: int) -> int:
        victim = self.alive[-1]
        self.driver.write(
            self.tick(),
            "fault_injected",
            kind="kill",
            point="backward",
            cell=victim,
            rank=0,
            rollout=rollout,
            step=step,
        )
        for s in self.ranks_of.pop(victim):
            s.close(self.now, declare=False)  # killed: no log_closed
        for cell in self.alive[:-1]:
            for rank, s in enumerate(self.ranks_of[cell]):
                s.write(
                    self.tick(),
                    "step_outcome",
                    cell=cell,
                    rank=rank,
                    step=step,
                    rollout=rollout,
                    attempt=0,
                    epoch=self.epoch,
                    outcome="failed",
                    micro_shards=[],
                )
        self.state(victim, "alive", "errored", "rank died")
        self.epoch += 1
        self.alive_lost = victim
        self.reconfigure(self.alive[:-1], f"cell {victim} died")
        return 1

    def _heal(self, cell: int, step: int) -> None:
        self.state(cell, "errored", "starting", "restart")
        self._start(cell)
        total = _digest("state", step)
        self.epoch += 1
        self.driver.write(
            self.tick(),
            "heal",
            cell=cell,
            donor=self.alive[0],
            epoch=self.epoch,
            bytes=1 << 27,
            seconds={"transfer": 0.5, "verify": 0.02},
            total=total,
            donor_total=total,
        )
        self.state(cell, "starting", "alive", "healed")
        self.reconfigure([*self.alive, cell], f"cell {cell} healed")

    def _commit(self, rollout: int, step: int, attempt: int, ids: list[int]) -> None:
        shards = {c: [i for i in range(8) if i % len(self.alive) == j] for j, c in enumerate(self.alive)}
        for cell in self.alive:
            for rank, s in enumerate(self.ranks_of[cell]):
                s.write(
                    self.tick(),
                    "step_outcome",
                    cell=cell,
                    rank=rank,
                    step=step,
                    rollout=rollout,
                    attempt=attempt,
                    epoch=self.epoch,
                    outcome="committed",
                    micro_shards=shards[cell],
                )
                total, params, opt = self.fingerprint(step, rank)
                s.write(
                    self.tick(),
                    "state_fingerprint",
                    cell=cell,
                    rank=rank,
                    step=step,
                    rollout=rollout,
                    attempt=attempt,
                    params=params,
                    optimizer=opt,
                    total=total,
                )
                s.write(
                    self.tick(),
                    "witness_counts",
                    cell=cell,
                    rank=rank,
                    step=step,
                    rollout=rollout,
                    attempt=attempt,
                    ids=ids,
                    counts=[1] * len(ids),
                    contributions=[0.5] * len(ids),
                )
        self.driver.write(
            self.tick(), "metric", rollout=rollout, step=step, values={"loss": 1.0 / (1 + step), "reward": 0.5}
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path, help="the run directory (its events/ is written)")
    p.add_argument("--events", type=int, default=300_000, help="about this many events")
    p.add_argument("--cells", type=int, default=4)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--tensors", type=int, default=20)
    p.add_argument("--steps", type=int, default=8, help="steps per rollout")
    p.add_argument("--faults", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run", default="independent")
    args = p.parse_args(argv)
    per_rollout = args.steps * (3 * args.cells * args.tp * args.pp + 1) + 2 + args.engines
    rollouts = max(1, math.ceil(args.events / per_rollout))
    steps = rollouts * args.steps
    # faults well inside the run, at least 4 steps apart (a cell heals 2 steps after it died)
    faults = set(
        random.Random(args.seed).sample(range(1, max(2, steps - 3), 4), min(args.faults, max(0, (steps - 4) // 4)))
    )
    run = Run(args.out / "events", args)
    run.run(rollouts, faults)
    print(f"{args.out / 'events'}: {rollouts} rollouts, {steps} steps, faults at {sorted(faults)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
