"""GPU placement (``ftkit.train.plan.placement``): the pure plan for 1 and N GPUs, colocated and
separate engines, cells sharing a GPU and the refusals; then the plan's Ray requests against a
local Ray with *logical* GPUs (no CUDA needed): what the plan admits is placed by Ray, ranks that
must not share a GPU get distinct ones, and the run's default on one GPU fits."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest

from ftkit.errors import ConfigError
from ftkit.train.plan.placement import GRAIN, NOSET_ENV, plan_placement


def _per_gpu_ok(p, cells, engines, gpus):
    """No GPU is over-asked: the shares of what may land on one GPU sum to at most 1."""
    ranks_per_gpu = math.ceil(cells * p.ranks_per_cell / max(gpus - (engines if p.engine_gpu == 1.0 else 0), 1))
    engines_per_gpu = 0 if p.engine_gpu == 1.0 else math.ceil(engines / gpus)
    load = ranks_per_gpu * p.rank_gpu + engines_per_gpu * p.engine_gpu
    assert load <= 1.0 + 1e-12
    assert p.rank_gpu * GRAIN == int(p.rank_gpu * GRAIN) and p.engine_gpu * GRAIN == int(p.engine_gpu * GRAIN)


def test_cpu_has_no_gpu_shares_and_a_gloo_link():
    p = plan_placement(2, 2, 1, 1, "cpu", [])
    assert (p.rank_gpu, p.engine_gpu, p.link, p.shared) == (0.0, 0.0, "gloo", False)
    assert p.rank_resources() == {"CPU": 0.5} == p.engine_resources()
    assert p.runtime_env() is None and p.rank_device(1, 1) is None


def test_one_gpu_two_cells_and_an_engine_share_it_over_gloo_host():
    p = plan_placement(2, 1, 1, 1, "cuda", [1])
    assert p.shared and p.link == "gloo-host"
    assert p.rank_gpu == p.engine_gpu == 0.3333  # 2 ranks + 1 engine on the GPU
    assert [p.rank_device(c, 0) for c in range(2)] == [0, 0] and p.engine_device(0) == 0
    assert p.runtime_env() == {"env_vars": {NOSET_ENV: "1"}}
    _per_gpu_ok(p, 2, 1, 1)


def test_one_gpu_one_cell_keeps_nccl_and_colocates_the_engine():
    p = plan_placement(1, 1, 1, 1, "cuda", [1])
    assert not p.shared and p.link == "nccl"
    assert p.rank_gpu > 0.5 and p.rank_gpu + p.engine_gpu <= 1.0  # the engine fits beside the rank
    assert p.rank_device(0, 0) is None and p.runtime_env() is None  # Ray's own visible device
    _per_gpu_ok(p, 1, 1, 1)


def test_n_gpus_ranks_first_then_engines_on_their_gpus():
    p = plan_placement(2, 2, 1, 2, "cuda", [4])  # 4 ranks on 4 GPUs, 2 engines beside them
    assert not p.shared and p.link == "nccl" and p.rank_gpu > 0.5
    assert 2 * p.rank_gpu > 1.0  # two ranks never share a GPU
    _per_gpu_ok(p, 2, 2, 4)
    q = plan_placement(4, 2, 1, 1, "cuda", [4])  # 8 ranks on 4 GPUs: cells share
    assert q.shared and q.link == "gloo-host"
    devices = {c: [q.rank_device(c, r) for r in range(2)] for c in range(4)}
    assert all(len(set(d)) == 2 for d in devices.values())  # a TP group on distinct GPUs
    assert devices == {0: [0, 1], 1: [2, 3], 2: [0, 1], 3: [2, 3]}
    _per_gpu_ok(q, 4, 1, 4)


def test_separate_engines_take_whole_gpus_of_their_own():
    p = plan_placement(2, 1, 1, 1, "cuda", [3], "separate")
    assert (p.rank_gpu, p.engine_gpu, p.link, p.shared) == (1.0, 1.0, "nccl", False)
    q = plan_placement(3, 1, 1, 1, "cuda", [2], "separate")  # 3 cells on the one GPU left
    assert q.shared and q.engine_gpu == 1.0 and q.rank_gpu == 0.3333
    assert {q.rank_device(c, 0) for c in range(3)} == {0} and q.engine_device(0) == 1


def test_a_layout_that_cannot_be_placed_is_one_line_saying_what_fits():
    with pytest.raises(ConfigError) as tp2:
        plan_placement(2, 2, 1, 1, "cuda", [1])
    assert "tp 2 x pp 1 needs 2 distinct GPUs" in tp2.value.message and "1 GPU(s)" in tp2.value.message
    assert "at most 1" in tp2.value.hint and "--tp 1" in tp2.value.hint
    assert "\n" not in tp2.value.message + tp2.value.hint
    with pytest.raises(ConfigError) as sep:
        plan_placement(1, 1, 1, 1, "cuda", [1], "separate")
    assert "besides 1 engine GPU(s)" in sep.value.message and "colocate" in sep.value.hint
    with pytest.raises(ConfigError) as node:  # cells that share GPUs keep a cell on one node
        plan_placement(3, 2, 1, 1, "cuda", [1, 1, 1, 1])
    assert "a node has 1 GPU(s)" in node.value.message
    with pytest.raises(ConfigError, match="needs 1 distinct GPUs"):
        plan_placement(1, 1, 1, 1, "cuda", [0])


_RAY_PROBE = textwrap.dedent(
    """
    import json, os, sys
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    from ftkit.train.control.cells import actor_options, check_resources
    from ftkit.train.plan.placement import NOSET_ENV, plan_placement

    class Probe:
        def seen(self):
            return [int(float(g)) for g in ray.get_gpu_ids()], os.environ.get(NOSET_ENV)

    out = {}
    for name, gpus, layout in [("one", 1, (2, 1, 1, 1)), ("two", 2, (2, 1, 1, 1))]:
        ray.init(address="local", num_cpus=8, num_gpus=gpus, include_dashboard=False, log_to_driver=False)
        cells, tp, pp, engines = layout
        p = plan_placement(cells, tp, pp, engines, "cuda", [gpus])
        check_resources(p, cells, engines)
        groups, actors = [], []
        for c in range(cells):
            g = placement_group([p.rank_resources()], strategy="STRICT_PACK" if p.shared else "PACK")
            ray.get(g.ready(), timeout=60)
            groups.append(g)
            strategy = PlacementGroupSchedulingStrategy(placement_group=g, placement_group_bundle_index=0)
            actors.append(ray.remote(Probe).options(**actor_options(p.rank_resources(), p),
                                                     scheduling_strategy=strategy).remote())
        actors += [ray.remote(Probe).options(**actor_options(p.engine_resources(), p)).remote()
                   for _ in range(engines)]
        out[name] = {"link": p.link, "seen": ray.get([a.seen.remote() for a in actors], timeout=120)}
        ray.shutdown()
    print(json.dumps(out))
    """
)


@pytest.mark.slow
def test_the_plans_requests_place_on_ray_with_logical_gpus():
    env = {**os.environ, "RAY_DEDUP_LOGS": "0"}
    run = subprocess.run([sys.executable, "-c", _RAY_PROBE], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    # one GPU: 2 cells and the engine all fit on GPU 0; Ray leaves the devices to the plan
    assert out["one"]["link"] == "gloo-host"
    assert [noset for _, noset in out["one"]["seen"]] == ["1", "1", "1"]
    # two GPUs: a GPU per cell (NCCL link), the ranks on distinct GPUs, the engine beside one
    assert out["two"]["link"] == "nccl"
    (r0, _), (r1, _), (e0, _) = out["two"]["seen"]
    assert len(r0) == len(r1) == len(e0) == 1 and r0 != r1 and e0[0] in r0 + r1
