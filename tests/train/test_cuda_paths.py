"""The CUDA paths of training, where a GPU is (skipped without one; run on an H200 for the
notes of the fault-tolerance work): the exact reduction's torch kernels give the numpy CPU
kernels' bits, a rank on CUDA (megatron GPT with the SDPA spec, witness, NCCL cross-cell
link) is deterministic, 1 cell equals 2 cells sharing the GPU bitwise (their link: gloo through
pinned host buffers), the rank-state codec round-trips device tensors, engines generate
independently of how samples are split and report the trainer's log-probs bit for bit (FT114),
and the default ``ftkit train --device cuda`` on one GPU ends PASS."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("k", [1, 4])
def test_exact_reducer_cuda_kernels_equal_the_cpu_kernels(k: int) -> None:
    """The fused CUDA kernels (Triton through torch.compile) give the numpy kernels' bits,
    subnormal gradients included (no flush to zero), for one row and several."""
    from ftkit.train.rank.exact_kernels import warm_up
    from ftkit.train.rank.reducer import ExactReducer, GradLayout

    warm_up(torch.device("cuda"))
    g = torch.Generator().manual_seed(0)
    layout = GradLayout.of([("a", (64, 33)), ("b", (1000,)), ("z", (17,)), ("c", (5, 7, 3)), ("s", (99,))])
    rows = torch.randn(k, layout.numel, generator=g) * torch.logspace(-8, 3, layout.numel)
    rows[:, layout.offsets[2] : layout.offsets[2] + 17] = 0.0
    rows[:, layout.offsets[4] :] = torch.randn(k, 99, generator=g) * 3e-39  # subnormal: quantised to a few units
    side = torch.arange(8, dtype=torch.float64)
    cpu_side, gpu_side = side.clone(), side.clone()
    cpu = ExactReducer(layout, 8).reduce(rows.clone(), lambda t, op: None, side=cpu_side)
    gpu = ExactReducer(layout, 8).reduce(rows.clone().cuda(), lambda t, op: None, side=gpu_side)
    assert torch.equal(cpu.view(torch.int32), gpu.cpu().view(torch.int32))
    assert torch.equal(cpu_side, gpu_side)


def _proc(index: int, jobs: list[Any]) -> None:
    from cellrun import synthetic_batch

    from ftkit.train.config import TrainConfig
    from ftkit.train.plan.placement import plan_placement
    from ftkit.train.plan.run_plan import build_plan
    from ftkit.train.rank.state_codec import decode, encode
    from ftkit.train.rank.step_types import StepTask
    from ftkit.train.rank.worker import RankWorker
    from ftkit.train.rl.microshards import assign

    run_dir, cfg_dict, alive, steps, cell, port = jobs[index]
    cfg = TrainConfig.model_validate(cfg_dict)
    batch = synthetic_batch(cfg)
    # the plan of these cells on one GPU: two cells share it, their link is gloo through pinned host buffers
    placement = plan_placement(len(alive), 1, 1, 1, "cuda", [1])
    assert placement.link == ("gloo-host" if len(alive) > 1 else "nccl")
    w = RankWorker(dataclasses.replace(build_plan(cfg), placement=placement), run_dir, cell, 0, 0)
    w.init_cell("127.0.0.1", port)
    w.configure(0, alive)
    shards = tuple(assign(cfg.batch.micro_shards, alive)[cell])
    for s in range(steps):
        assert w.compute_reduce(StepTask(0, s, 0, 0, shards), batch).finite
        w.commit(s, 0, write_dumps=False)
    tensors, meta, _ = w.donor_state()
    again, _ = encode(decode({k: v.clone() for k, v in tensors.items()}, dict(meta)))
    roundtrip = sorted(again) == sorted(tensors) and all(torch.equal(again[k], tensors[k]) for k in tensors)
    out = Path(run_dir) / f"cell{cell}"
    w.save_final(str(out))
    (out / "codec.json").write_text(
        json.dumps({"roundtrip": roundtrip, "device": str(tensors[next(iter(tensors))].device)})
    )
    w.shutdown()


def test_a_cuda_rank_is_deterministic_and_two_cells_sharing_the_gpu_equal_one(tmp_path: Path) -> None:
    """Run "c" is two cells on the one GPU (the plan's gloo-host link): the same bits as one cell."""
    from safetensors.torch import load_file

    from ftkit.train.config import TrainConfig

    cfg = TrainConfig(
        samples_per_rollout=24,
        steps_per_rollout=2,
        micro_shards=6,
        group_size=4,
        seed=7,
        lr=1e-3,
        response_len=6,
        device="cuda",
        dump_rollouts="none",
    ).model_dump(mode="json")
    runs = {"a": [0], "b": [0], "c": [0, 1]}
    stores, jobs = [], []
    for name, alive in runs.items():
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        stores.append(store)
        (tmp_path / name).mkdir()
        jobs += [(str(tmp_path / name), cfg, alive, 2, c, store.port) for c in alive]
    mp.start_processes(_proc, args=(jobs,), nprocs=len(jobs), start_method="spawn", join=True)

    def final(name: str, cell: int = 0) -> dict[str, bytes]:
        f = next((tmp_path / name / f"cell{cell}" / "final").glob("*.safetensors"))
        return {k: v.numpy().tobytes() for k, v in load_file(f).items()}

    assert final("a") == final("b")  # the same run twice: the same bits
    assert final("a") == final("c") == final("c", 1)  # 1 cell == 2 cells, and the 2 cells agree
    codec = json.loads((tmp_path / "a" / "cell0" / "codec.json").read_text())
    assert codec == {"roundtrip": True, "device": "cuda:0"}


def test_engine_generation_does_not_depend_on_the_split(tmp_path: Path) -> None:
    from ftkit.tasks.addition import AdditionTask
    from ftkit.train.config import TrainConfig
    from ftkit.train.plan.run_plan import build_plan
    from ftkit.train.rl.engines import EngineActor

    (tmp_path / "events").mkdir()
    engine = EngineActor(build_plan(TrainConfig(device="cuda")), str(tmp_path), 0)
    prompts = AdditionTask(8).prompts(0, 0, 8).repeat_interleave(4, dim=0)
    (whole, whole_lp), (part, part_lp) = engine.generate(prompts, 0, 0), engine.generate(prompts[16:], 0, 16)
    assert torch.equal(whole[16:], part) and torch.equal(whole_lp[16:], part_lp)


def test_the_engine_reports_the_trainers_log_probs_bit_for_bit_on_cuda() -> None:
    """FT114 exact on CUDA: the engine's reported log-probs and canary scores are the trainer's
    computation in the trainer's shapes, bit for bit (tests/train/test_engine_scoring.py)."""
    from test_engine_scoring import run_scoring_check

    checks = run_scoring_check("cuda")
    assert checks["reported_is_trainer"] and checks["canary_is_trainer"] and checks["short_pass"], checks
    assert checks["same_samples"], checks


def test_the_default_run_on_one_gpu_ends_pass(tmp_path: Path) -> None:
    """``ftkit train --device cuda`` with its defaults (2 cells and an engine on one GPU): PASS,
    FT114 included (no tolerance at TP=1)."""
    import os
    import subprocess
    import sys

    if torch.cuda.device_count() != 1:
        pytest.skip("the one-GPU default needs exactly one visible GPU")
    out = tmp_path / "run"
    run = subprocess.run(
        [sys.executable, "-m", "ftkit", "train", "--device", "cuda", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=1800,
        env=os.environ.copy(),
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "PASS" in run.stdout and "FT114" not in run.stdout
