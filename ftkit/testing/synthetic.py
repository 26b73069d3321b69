"""Synthetic run logs: realistic, clean by construction, deterministic for a seed.

``generate(out_dir, SyntheticSpec(...))`` simulates what ``ftkit train`` logs: a driver (run,
cell states, reconfigures, witness allocation, weights sent, metrics, checkpoints, faults and
heals), ``cells x tp x pp`` rank processes (step outcomes, state fingerprints of ``tensors``
tensors split across pipeline stages, witness counts, dumps) and
engines (the weights they loaded). Each process writes its own file with ``EventWriter`` under
``out_dir/events/`` on a simulated clock, so the files merge by time exactly as real ones do.

Faults kill one rank of a live cell in the middle of a step: its files end, the other cells
fail the attempt, the driver marks the cell errored and reconfigures, the step is retried with
the survivors and commits; ``heal_after`` steps later the cell is restarted (a new incarnation),
healed from a donor and rejoins. Every sample is counted exactly once per rollout.

``violation="FT1xx"`` injects exactly one violation of that rule (used by the property tests);
``VIOLATIONS`` lists them. Module CLI::

    python -m ftkit.testing.synthetic OUT_DIR [--cells N --rollouts R --faults F --seed S ...]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftkit import __version__
from ftkit.events.writer import EventWriter
from ftkit.tensors.fingerprint import combine, state_total

VIOLATIONS = (
    "FT101",
    "FT102",
    "FT103",
    "FT104",
    "FT105",
    "FT106",
    "FT107",
    "FT108",
    "FT109",
    "FT110",
    "FT111",
    "FT112",
    "FT113",
    "FT114",
)
_LAYER_TENSORS = (
    "input_layernorm.weight",
    "self_attention.linear_qkv.weight",
    "self_attention.linear_qkv.bias",
    "self_attention.linear_proj.weight",
    "pre_mlp_layernorm.weight",
    "mlp.linear_fc1.weight",
    "mlp.linear_fc2.weight",
    "mlp.linear_fc1.bias",
)


@dataclass
class SyntheticSpec:
    cells: int = 4
    tp: int = 1
    pp: int = 1
    engines: int = 2
    rollouts: int = 3
    steps_per_rollout: int = 4
    samples_per_rollout: int = 32
    micro_shards: int = 8
    tensors: int = 100
    faults: int = 1
    heal_after: int = 1
    checkpoint_every: int = 4
    seed: int = 0
    run: str = "synthetic"
    loss: str = "reinforce"  # grpo: ranks log logprob_check at each rollout's first step (FT114)
    violation: str | None = None

    @property
    def steps(self) -> int:
        return self.rollouts * self.steps_per_rollout


@dataclass
class GeneratedRun:
    events_dir: Path
    events: int
    fault_steps: list[int] = field(default_factory=list)
    violation_step: int | None = None


def tensor_names(n: int) -> list[str]:
    """``n`` Megatron-style parameter names (embedding, layers, final norm, output layer)."""
    names = ["embedding.word_embeddings.weight"]
    layer = 0
    while len(names) < n - 2:
        names += [f"decoder.layers.{layer}.{t}" for t in _LAYER_TENSORS][: n - 2 - len(names)]
        layer += 1
    return (names + ["decoder.final_layernorm.weight", "output_layer.weight"])[:n]


def _hex(*parts: Any) -> str:
    return hashlib.blake2b(repr(parts).encode(), digest_size=16).hexdigest()


class _Sim:
    """The simulated run; ``run()`` writes every file and returns the event count."""

    def __init__(self, out_dir: Path, spec: SyntheticSpec) -> None:
        if spec.violation is not None and spec.violation not in VIOLATIONS:
            raise ValueError(f"unknown violation {spec.violation!r}; one of {VIOLATIONS}")
        if spec.samples_per_rollout % spec.steps_per_rollout:
            raise ValueError("samples_per_rollout must be a multiple of steps_per_rollout")
        self.spec, self.dir = spec, out_dir / "events"
        self.rng = random.Random(spec.seed)
        self.now = 1_700_000_000.0 + spec.seed
        self.ranks = spec.tp * spec.pp
        names = tensor_names(spec.tensors)
        self.stage_names = [names[i :: spec.pp] for i in range(spec.pp)]
        self.events = 0
        v = spec.violation
        needs_fault = v in ("FT107",) and spec.faults == 0
        n_faults = max(spec.faults, 1 if needs_fault else 0) if spec.cells > 1 else 0
        candidates = list(range(1, max(1, spec.steps - 1 - spec.heal_after))) or list(range(1, max(1, spec.steps - 1)))
        self.fault_steps = sorted(self.rng.sample(candidates, min(n_faults, len(candidates))))
        self.violation_step = self._violation_step()
        self.violation_left = spec.violation  # injected once, at violation_step or the next step that allows it
        self.grpo = spec.loss == "grpo" or v == "FT114"
        self.injected_faults: list[int] = []
        self.healed = 0
        self.driver = self._writer("driver", None, None)
        self.rank_writers: dict[tuple[int, int], EventWriter] = {}
        self.engine_writers = [self._writer("engine", None, e) for e in range(spec.engines)]
        self.epoch = 0
        self.alive: list[int] = list(range(spec.cells))
        self.dead: dict[int, int] = {}  # cell -> step at which to heal
        self._fp_cache: tuple[int, dict[int, tuple[str, dict[str, Any], dict[str, Any]]]] = (-1, {})

    def _violation_step(self) -> int | None:
        v, steps = self.spec.violation, self.spec.steps
        if v is None:
            return None
        if v == "FT109":
            return steps - 1
        touched = {f + d for f in self.fault_steps for d in (0, 1, 1 + self.spec.heal_after)}
        clean = [s for s in range(steps) if s not in touched]
        return clean[0] if v in ("FT101",) else clean[len(clean) // 2]

    # ------------------------------------------------------------------ plumbing
    def _clock(self) -> float:
        self.now += 0.0005
        self.events += 1
        return self.now

    def _writer(self, role: str, cell: int | None, rank: int | None) -> EventWriter:
        return EventWriter(
            self.dir,
            self.spec.run,
            role,
            cell,
            rank,
            clock=self._clock,
            pid=10_000 + self.events,
            host=f"sim-{cell if cell is not None else 'driver'}",
        )

    def _cell_state(self, cell: int, old: str, new: str, reason: str) -> None:
        self.driver.emit("cell_state", cell=cell, old=old, new=new, reason=reason)

    def _reconfigure(self, alive: list[int], reason: str) -> None:
        before, self.alive = self.alive, sorted(alive)
        self.epoch += 1
        self.driver.emit("reconfigure", epoch=self.epoch, alive_before=before, alive_after=self.alive, reason=reason)

    def _start_cell(self, cell: int) -> None:
        for rank in range(self.ranks):
            self.rank_writers[(cell, rank)] = self._writer("trainer", cell, rank)

    def _fingerprints(self, step: int) -> dict[int, tuple[str, dict[str, Any], dict[str, Any]]]:
        if self._fp_cache[0] != step:
            fps = {}
            for rank in range(self.ranks):
                tp_rank, stage = rank % self.spec.tp, rank // self.spec.tp
                params = {n: _hex(self.spec.seed, step, tp_rank, n) for n in self.stage_names[stage]}
                opt = {n: _hex("opt", self.spec.seed, step, tp_rank, n) for n in self.stage_names[stage]}
                fps[rank] = (state_total(params, opt), params, opt)
            self._fp_cache = (step, fps)
        return self._fp_cache[1]

    # ------------------------------------------------------------------ the run
    def run(self) -> int:
        spec, d = self.spec, self.driver
        d.emit(
            "run_started",
            config={
                "seed": spec.seed,
                "synthetic": True,
                "micro_shards": spec.micro_shards,
                "loss": "grpo" if self.grpo else spec.loss,
                "samples_per_rollout": spec.samples_per_rollout,
                "steps_per_rollout": spec.steps_per_rollout,
            },
            num_cells=spec.cells,
            tp=spec.tp,
            pp=spec.pp,
            num_engines=spec.engines,
            ftkit_version=__version__,
        )
        for cell in range(spec.cells):
            self._cell_state(cell, "pending", "starting", "launch")
            self._start_cell(cell)
            self._cell_state(cell, "starting", "alive", "ready")
        self.driver.emit("reconfigure", epoch=0, alive_before=[], alive_after=self.alive, reason="start")
        last_ckpt = -1
        for rollout in range(spec.rollouts):
            ids = [rollout * spec.samples_per_rollout + i for i in range(spec.samples_per_rollout)]
            d.emit("witness_allocated", rollout=rollout, attempt=0, ids=ids, expected=1)
            self._weights(rollout)
            per_step = spec.samples_per_rollout // spec.steps_per_rollout
            for k in range(spec.steps_per_rollout):
                step = rollout * spec.steps_per_rollout + k
                self._heal_due(step)
                self._step(rollout, step, ids[k * per_step : (k + 1) * per_step])
                if ((step + 1) % spec.checkpoint_every == 0 and step != spec.steps - 1) or (
                    spec.violation == "FT110" and step == self.violation_step
                ):
                    self._checkpoint(step, last_ckpt + 1)
                    last_ckpt = step
        for cell in self.alive:
            self._cell_state(cell, "alive", "stopped", "run end")
        status = "failed" if spec.violation == "FT113" else "completed"
        d.emit("run_finished", status=status, reason="injected" if status == "failed" else None)
        for w in [*self.rank_writers.values(), *self.engine_writers, d]:
            w.close()
        return self.events

    def _weights(self, rollout: int) -> None:
        params = {n: _hex("w", self.spec.seed, rollout, n) for names in self.stage_names for n in names}
        total = combine(params)
        self.driver.emit("weights_sent", rollout=rollout, version=rollout, total=total, params=params)
        for e, w in enumerate(self.engine_writers):
            got, loaded = total, params
            if self.spec.violation == "FT102" and rollout == self.spec.rollouts - 1 and e == 0:
                loaded = dict(params)
                first = next(iter(loaded))
                loaded[first] = _hex("stale", first)
                got = combine(loaded)
            w.emit("engine_weights", rollout=rollout, version=rollout, engine=e, total=got, params=loaded)
            if self.spec.pp == 1:  # ftkit train scores the canary set at pp=1 only
                w.emit("canary_logprobs", rollout=rollout, version=rollout, engine=e, **_canary(rollout))

    def _heal_due(self, step: int) -> None:
        for cell, at in sorted(self.dead.items()):
            if at != step:
                continue
            del self.dead[cell]
            self._cell_state(cell, "errored", "starting", "restart")
            self._start_cell(cell)
            donor = self.alive[0]
            total = _hex(self._fingerprints(step - 1)[0][0], "state")
            received = _hex("corrupt") if self.spec.violation == "FT107" else total
            self.healed += 1
            self.driver.emit(
                "heal",
                cell=cell,
                donor=donor,
                epoch=self.epoch + 1,
                bytes=123_456_789,
                seconds={"transfer": 0.8, "verify": 0.05},
                total=received,
                donor_total=total,
            )
            self._cell_state(cell, "starting", "alive", "healed")
            self._reconfigure(self.alive + [cell], f"cell {cell} healed")

    def _step(self, rollout: int, step: int, ids: list[int]) -> None:
        attempt = 0
        if step in self.fault_steps and len(self.alive) > 1:
            victim = self.alive[-1]
            self.injected_faults.append(step)
            self.driver.emit(
                "fault_injected", kind="kill", point="backward", cell=victim, rank=0, rollout=rollout, step=step
            )
            for rank in range(self.ranks):  # the victim's processes die: their files end here, unclosed
                _die(self.rank_writers.pop((victim, rank)))
            for cell in self.alive:
                if cell != victim:
                    for rank in range(self.ranks):
                        self.rank_writers[(cell, rank)].emit(
                            "step_outcome",
                            rollout=rollout,
                            step=step,
                            attempt=0,
                            epoch=self.epoch,
                            cell=cell,
                            rank=rank,
                            outcome="failed",
                            micro_shards=[],
                        )
            self._cell_state(victim, "alive", "errored", "rank died")
            self._reconfigure([c for c in self.alive if c != victim], f"cell {victim} died")
            self.dead[victim] = min(step + 1 + self.spec.heal_after, self.spec.steps)
            attempt = 1
        self._commit(rollout, step, attempt, ids)

    def _commit(self, rollout: int, step: int, attempt: int, ids: list[int]) -> None:
        spec, v = self.spec, None
        if (
            self.violation_left
            and self.violation_step is not None
            and step >= self.violation_step
            and (len(self.alive) > 1 or self.violation_left not in ("FT101", "FT106"))
            and (self.violation_left != "FT114" or step % spec.steps_per_rollout == 0)  # a first step
        ):
            v, self.violation_left, self.violation_step = self.violation_left, None, step
        shards = _assign(spec.micro_shards, self.alive)
        fps = self._fingerprints(step)
        counts = {i: 1 for i in ids}
        if v == "FT103":
            counts.pop(ids[0])
        elif v == "FT104":
            counts[ids[0]] = 2
        elif v == "FT105":
            counts[10_000_000 + step] = 1
        for cell in self.alive:
            for rank in range(self.ranks):
                w = self.rank_writers[(cell, rank)]
                outcome = "discarded" if v == "FT106" and cell == self.alive[-1] and rank == 0 else "committed"
                w.emit(
                    "step_outcome",
                    rollout=rollout,
                    step=step,
                    attempt=attempt,
                    epoch=self.epoch,
                    cell=cell,
                    rank=rank,
                    outcome=outcome,
                    micro_shards=shards[cell],
                )
                total, params, opt = fps[rank]
                if v == "FT101" and cell == self.alive[-1] and rank == 0:
                    params = dict(params)
                    name = next(iter(params))
                    params[name] = _hex("diverged", name)
                    total = state_total(params, opt)
                if not (v == "FT112" and cell == self.alive[-1] and rank == 0):
                    w.emit(
                        "state_fingerprint",
                        rollout=rollout,
                        step=step,
                        attempt=attempt,
                        cell=cell,
                        rank=rank,
                        total=total,
                        params=params,
                        optimizer=opt,
                    )
                if v == "FT111" and cell == self.alive[0] and rank == 0:
                    w.emit("metric", rollout=rollout, step=step, values=object())  # cannot serialise: a seq gap
                w.emit(
                    "witness_counts",
                    rollout=rollout,
                    step=step,
                    attempt=attempt,
                    cell=cell,
                    rank=rank,
                    ids=list(counts),
                    counts=list(counts.values()),
                    contributions=[round(0.25 + (i % 7) / 10, 3) for i in counts],
                )
            if v == "FT110" and cell == self.alive[0]:
                self.rank_writers[(cell, 0)].emit(
                    "grad_nonfinite",
                    rollout=rollout,
                    step=step,
                    cell=cell,
                    rank=0,
                    where="decoder.layers.0.mlp.linear_fc1.weight",
                )
        if step % spec.steps_per_rollout == 0 and spec.pp == 1:
            for cell in self.alive:
                self.rank_writers[(cell, 0)].emit(
                    "canary_logprobs", rollout=rollout, version=rollout, cell=cell, rank=0, **_canary(rollout)
                )
        if self.grpo and step % spec.steps_per_rollout == 0:  # the whole rollout is compared
            every = list(range(rollout * spec.samples_per_rollout, (rollout + 1) * spec.samples_per_rollout))
            self._logprob_checks(rollout, step, attempt, every, v == "FT114")
        if v == "FT108":
            self._cell_state(self.alive[0], "starting", "alive", "injected")
        loss = float("nan") if v == "FT109" else round(2.5 / (1 + step), 6)
        self.driver.emit(
            "metric",
            rollout=rollout,
            step=step,
            values={"loss": loss, "grad_norm": round(1.0 + (step % 5) / 10, 4), "reward": 0.5},
        )
        if rollout == 0 and step == 0:
            self.rank_writers[(self.alive[0], 0)].emit(
                "dump_written",
                rollout=rollout,
                phase="fwd_bwd",
                path="dumps/actor/fwd_bwd/rollout_000000/x.safetensors",
                tensors=len(fps[0][1]),
                bytes=1 << 20,
            )

    def _logprob_checks(self, rollout: int, step: int, attempt: int, ids: list[int], mismatch: bool) -> None:
        """Rank 0 of each live cell compares its share of the rollout's samples (GRPO); with
        ``mismatch`` one token of the first cell's first sample differs."""
        width = 4  # response positions
        for j, cell in enumerate(self.alive):
            mine = ids[j :: len(self.alive)]
            if not mine:
                continue
            bad = mismatch and j == 0
            same = {"tokens": width, "differing": 0, "nonfinite": 0, "max_abs": 0.0, "mean_abs": 0.0, "k3": 0.0}
            off = {**same, "differing": 1, "max_abs": 0.5, "mean_abs": 0.125, "k3": 0.01}
            samples = [off if bad and i == 0 else same for i in range(len(mine))]
            positions = [{**same, "tokens": len(mine)} for _ in range(width)]
            if bad:
                positions[2] = {**off, "tokens": len(mine), "mean_abs": 0.5 / len(mine)}
            total = {
                **same,
                "tokens": width * len(mine),
                **({"differing": 1, "max_abs": 0.5, "mean_abs": 0.5 / (width * len(mine))} if bad else {}),
            }
            self.rank_writers[(cell, 0)].emit(
                "logprob_check",
                rollout=rollout,
                step=step,
                attempt=attempt,
                cell=cell,
                rank=0,
                version=rollout,
                witness_ids=mine,
                samples=samples,
                positions=positions,
                total=total,
            )

    def _checkpoint(self, step: int, first: int) -> None:
        self.driver.emit(
            "checkpoint_published",
            step=step,
            path=f"checkpoints/step_{step:06d}",
            kind="latest",
            metric=round(1.0 / (1 + step), 6),
            manifest_sha256=_hex("manifest", step) * 2,
            guard_from_step=first,
            guard_to_step=step,
        )


def _canary(version: int) -> dict[str, Any]:
    """The canary scores of a weights version (the same for every engine and cell)."""
    return {"rows": 2, "logprobs": [-0.015625 * (version + 1) * (i + 1) for i in range(8)]}


def _die(writer: EventWriter) -> None:
    """What a killed process leaves: its lines so far, no ``log_closed`` (the descriptor just goes)."""
    writer.sync()
    fd, writer._fd = writer._fd, None  # noqa: SLF001 - simulating a process killed mid-run
    if fd is not None:
        os.close(fd)


def _assign(m: int, alive: list[int]) -> dict[int, list[int]]:
    """Contiguous micro-shard ranges per alive cell (a deterministic function of the alive set)."""
    out, start = {}, 0
    for i, cell in enumerate(alive):
        n = m // len(alive) + (1 if i < m % len(alive) else 0)
        out[cell] = list(range(start, start + n))
        start += n
    return out


def generate(out_dir: str | Path, spec: SyntheticSpec | None = None) -> GeneratedRun:
    """Write a synthetic run's logs to ``out_dir/events/``; ValueError when ``spec.violation``
    cannot be injected into the layout (one cell for FT101/FT106; no room to heal for FT107; no
    rollout's first step left for FT114)."""
    spec = spec or SyntheticSpec()
    sim = _Sim(Path(out_dir), spec)
    n = sim.run()
    unplaced = spec.violation in ("FT101", "FT106", "FT114") and sim.violation_left
    if (spec.violation == "FT107" and not sim.healed) or unplaced:
        raise ValueError(
            f"cannot inject {spec.violation} into this layout: it needs two live cells "
            f"(FT107: a fault healed before the last step; FT114: a rollout's first step after the faults)"
        )
    return GeneratedRun(sim.dir, n, sim.injected_faults, sim.violation_step if sim.violation_left is None else None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m ftkit.testing.synthetic", description="Write a synthetic, clean run log to OUT_DIR/events/."
    )
    p.add_argument("out_dir", metavar="OUT_DIR")
    defaults = SyntheticSpec()
    for name in (
        "cells",
        "tp",
        "pp",
        "engines",
        "rollouts",
        "steps_per_rollout",
        "samples_per_rollout",
        "micro_shards",
        "tensors",
        "faults",
        "heal_after",
        "checkpoint_every",
        "seed",
    ):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(defaults, name))
    p.add_argument("--run", default=defaults.run)
    p.add_argument("--loss", choices=("reinforce", "grpo"), default=defaults.loss)
    p.add_argument("--violation", choices=VIOLATIONS, help="inject exactly one violation of this rule")
    args = vars(p.parse_args(argv))
    out = Path(args.pop("out_dir"))
    if (out / "events").exists() and any((out / "events").iterdir()):
        p.error(f"{out / 'events'} is not empty")
    run = generate(out, SyntheticSpec(**args))
    print(f"wrote {run.events} events to {run.events_dir}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
