"""The retry's reuse of a discarded attempt's micro-shard rows (``ftkit.train.rank.shard_cache``)."""

import math

import pytest
import torch

from ftkit.train.rank.shard_cache import ShardCache


def test_a_discarded_attempts_rows_serve_the_same_steps_retry_only():
    cache = ShardCache()
    rows, losses = torch.randn(2, 5), torch.tensor([0.0, 1.5, 0.0, 2.5], dtype=torch.float64)
    cache.computed(3, [1, 3], rows, losses)
    assert cache.discarded(3)
    got = cache.take(3)
    assert sorted(got) == [1, 3] and got[1][1] == 1.5 and got[3][1] == 2.5
    assert torch.equal(got[3][0], rows[1]) and got[3][0].data_ptr() == rows[1].data_ptr()  # no copy
    assert cache.take(3) == {}  # taken once
    cache.computed(3, [1], rows, losses)
    assert cache.discarded(3) and cache.take(4) == {}  # another step: nothing to reuse


def test_nothing_is_kept_for_a_commit_another_step_or_a_nonfinite_row():
    cache, losses = ShardCache(), torch.zeros(2, dtype=torch.float64)
    cache.computed(0, [0], torch.ones(1, 4), losses)
    cache.clear()
    assert not cache.discarded(0)
    cache.computed(0, [0], torch.ones(1, 4), losses)
    assert not cache.discarded(1)
    bad = torch.ones(1, 4)
    bad[0, 2] = math.nan
    cache.computed(0, [0], bad, losses)
    assert not cache.discarded(0) and cache.take(0) == {}


def _retry_proc(index: int, jobs: list) -> None:
    """One rank of a 1-cell world: ``reuse`` runs attempt 0 over micro-shard 0 (as if a lost
    peer had micro-shard 1), discards it and retries over both; ``fresh`` commits both at once."""
    import json
    from pathlib import Path

    from cellrun import synthetic_batch

    from ftkit.train.config import TrainConfig
    from ftkit.train.plan.run_plan import build_plan
    from ftkit.train.rank.step_types import StepTask
    from ftkit.train.rank.worker import RankWorker

    name, run_dir, cfg_dict, port = jobs[index]
    cfg = TrainConfig.model_validate(cfg_dict)
    batch = synthetic_batch(cfg)
    w = RankWorker(build_plan(cfg), run_dir, 0, 0, 0)
    w.init_cell("127.0.0.1", port)
    w.configure(0, [0])
    forwards = [0]
    inner = w.compute._forward_backward  # the step's phase 1 (StepCompute)

    def counted(part, norm, m):
        forwards[0] += 1
        return inner(part, norm, m)

    w.compute._forward_backward = counted
    attempt = 0
    if name == "reuse":
        w.compute_reduce(StepTask(0, 0, 0, 0, (0,)), batch)
        w.discard(0, 0)
        attempt = 1
    reduced = w.compute_reduce(StepTask(0, 0, attempt, 0, (0, 1)), batch)
    done = w.commit(0, attempt)
    Path(run_dir, "result.json").write_text(json.dumps([forwards[0], reduced.loss, done.total]))
    w.shutdown()


@pytest.mark.slow
def test_a_retry_reuses_the_survivors_rows_and_commits_the_same_bits(tmp_path):
    import json

    import torch.distributed as dist
    import torch.multiprocessing as mp

    from ftkit.train.config import TrainConfig

    cfg = TrainConfig(
        samples_per_rollout=8, steps_per_rollout=1, micro_shards=2, group_size=4, cells=2, dump_rollouts="none"
    ).model_dump(mode="json")
    stores, jobs = [], []
    for name in ("reuse", "fresh"):
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        stores.append(store)
        (tmp_path / name).mkdir()
        jobs.append((name, str(tmp_path / name), cfg, store.port))
    mp.start_processes(_retry_proc, args=(jobs,), nprocs=2, start_method="spawn", join=True)
    reuse, fresh = (json.loads((tmp_path / n / "result.json").read_text()) for n in ("reuse", "fresh"))
    assert reuse[0] == 2 and fresh[0] == 2  # the retry ran micro-shard 1 only
    assert reuse[1:] == fresh[1:]  # same loss, same state fingerprint after the commit
