"""Test harness: run RankWorkers of several cells as spawned processes, without Ray.

``run_cells(tmp, runs)`` starts one process per (run, cell, rank), each joining its run's
loopback TCPStore (hosted here, like the driver does), and trains the run's ``steps``
steps of rollout 0 on a deterministic synthetic batch (0 steps: just build and export).
An optional fourth item ``nan_step`` first runs that step with a NaN advantage in the last
sample (attempt 0, which must be discarded everywhere), then retries it clean (attempt 1).
Cell ``c`` writes its final state under
``<run_dir>/cell{c}/final/`` and rank 0 its TP-gathered export to
``<run_dir>/cell{c}/export.safetensors``; events and dumps go to ``<run_dir>`` as in a run.
Then every rank checks the canonical state round trip: rank 0 writes the cell's
``checkpoint_state`` (TP shards and stages gathered) to ``<run_dir>/cell{c}/canonical.safetensors``,
and every rank slices its own state back out of that file (``canonical_state.local_state``) and
records in ``roundtrip-r{rank}.json`` whether it equals what it holds, bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def synthetic_batch(cfg) -> dict:
    """A rollout batch shaped like the driver's (prompt 5 tokens, response ``response_len``)."""
    g = torch.Generator().manual_seed(1234)
    n, s = cfg.batch.samples_per_rollout, 5 + cfg.task.response_len
    tokens = torch.randint(0, 15, (n, s), generator=g)
    loss_mask = torch.zeros(n, s)
    loss_mask[:, 4 : s - 1] = 1.0
    rewards = torch.randint(0, 2, (n,), generator=g).float()
    adv = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
    return {
        "tokens": tokens,
        "loss_mask": loss_mask,
        "advantages": adv.float(),
        "rewards": rewards,
        "witness_ids": torch.arange(n, dtype=torch.int64),
    }


def _proc(index: int, jobs: list) -> None:
    from ftkit.tensors.st import write_safetensors_atomic
    from ftkit.train.config import TrainConfig
    from ftkit.train.plan.run_plan import build_plan
    from ftkit.train.rank.step_types import StepTask
    from ftkit.train.rank.worker import RankWorker
    from ftkit.train.rl.microshards import assign

    run_dir, cfg_dict, alive, steps, nan_step, cell, rank, port = jobs[index]
    cfg = TrainConfig.model_validate(cfg_dict)
    batch = synthetic_batch(cfg)
    w = RankWorker(build_plan(cfg), run_dir, cell, rank, 0)
    w.init_cell("127.0.0.1", port)
    w.configure(0, alive)
    results = []
    shards = tuple(assign(cfg.batch.micro_shards, alive)[cell])
    for step in range(steps):
        attempt = 0
        if step == nan_step:
            poisoned = dict(batch, advantages=batch["advantages"].clone())
            poisoned["advantages"][-1] = float("nan")
            reduced = w.compute_reduce(StepTask(0, step, 0, 0, shards), poisoned)
            assert not reduced.finite
            w.discard(step, 0)
            results.append({"committed": False, "loss": reduced.loss})
            attempt = 1
        task = StepTask(0, step, attempt, 0, shards, dump=True, dump_replicated=True)
        reduced = w.compute_reduce(task, batch)
        done = w.commit(step, attempt, write_dumps=cell == min(alive))
        results.append({"committed": True, "loss": reduced.loss, "grad_norm": done.grad_norm, "total": done.total})
    out = Path(run_dir) / f"cell{cell}"
    w.save_final(str(out))
    _, weights = w.export_weights(1)
    if weights:
        write_safetensors_atomic(out / "export.safetensors", weights)
    (out / f"results-r{rank}.json").write_text(json.dumps(results))
    _roundtrip(w, out)
    w.shutdown()


def _roundtrip(w, out: Path) -> None:
    from safetensors.torch import load_file

    from ftkit.model.stages import stage_position
    from ftkit.tensors.st import write_safetensors_atomic
    from ftkit.train.rank.canonical_state import local_state
    from ftkit.train.rank.state_codec import capture

    state = w.checkpoint_state()  # collective inside the cell
    if state:
        full = {f"model.{n}": t for n, t in state["params"].items()}
        full.update({f"optimizer.{n}": t for n, t in state["optimizer"].items()})
        write_safetensors_atomic(out / "canonical.safetensors", full)
    dist.barrier()
    full = load_file(out / "canonical.safetensors")
    params = {k.removeprefix("model."): t for k, t in full.items() if k.startswith("model.")}
    optim = {k.removeprefix("optimizer."): t for k, t in full.items() if k.startswith("optimizer.")}
    mine = capture(w.ctx.params, w.ctx.optimizer, None, w.counters)
    got_params, got_optim = local_state(
        params, optim, w.ctx.params, w.ctx.tp_rank, w.cfg.layout.tp, stage_position(w.ctx.model)[0]
    )
    same = (
        sorted(got_params) == sorted(mine.params)
        and sorted(got_optim) == sorted(mine.optimizer)
        and all(torch.equal(got_params[n], t) for n, t in mine.params.items())
        and all(torch.equal(got_optim[n], t) for n, t in mine.optimizer.items())
    )
    doc = {"equal": same, "params": len(mine.params), "optimizer": len(mine.optimizer), "canonical": len(full)}
    (out / f"roundtrip-r{w.rank}.json").write_text(json.dumps(doc))


def run_cells(tmp: Path, runs: dict[str, tuple]) -> dict[str, Path]:
    """Run every ``name: (cfg_dict, alive, steps[, nan_step])`` concurrently; returns ``{name: run_dir}``."""
    stores, jobs, dirs = [], [], {}
    for name, (cfg_dict, alive, steps, *rest) in runs.items():
        nan_step = rest[0] if rest else None
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        stores.append(store)
        run_dir = tmp / name
        (run_dir).mkdir(parents=True)
        dirs[name] = run_dir
        world = cfg_dict.get("tp", 1) * cfg_dict.get("pp", 1)
        for cell in alive:
            for rank in range(world):
                jobs.append((str(run_dir), cfg_dict, alive, steps, nan_step, cell, rank, store.port))
    mp.start_processes(_proc, args=(jobs,), nprocs=len(jobs), start_method="spawn", join=True)
    return dirs


def events(run_dir: Path, type_: str) -> list[dict]:
    """Every event of ``type_`` in the run's trainer logs."""
    out = []
    for path in sorted((run_dir / "events").glob("*.jsonl")):
        out += [e for e in map(json.loads, path.read_text().splitlines()) if e["type"] == type_]
    return out
