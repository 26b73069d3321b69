"""Inference engines as real Ray actors holding a real megatron-core GPTModel."""

import json
import time

import pytest
import torch

from ftkit.tasks.addition import EOS, RESPONSE_TOKENS, AdditionTask
from ftkit.train.rl.engines import GEN_CHUNK, EngineActor, split


def test_split_gives_contiguous_chunk_aligned_ranges():
    for n in (1, 15, 16, 17, 40, 64):
        for engines in (1, 2, 3, 5):
            ranges = split(n, engines)
            assert len(ranges) == engines
            assert ranges[0][0] == 0 and ranges[-1][1] == n
            assert all(a == prev_b for (_, prev_b), (a, _) in zip(ranges, ranges[1:]))
            assert all(a % GEN_CHUNK == 0 for a, b in ranges if b > a)
            chunks = [-(-(b - a) // GEN_CHUNK) for a, b in ranges]
            assert max(chunks) - min(chunks) <= 1  # whole chunks, spread evenly
    assert split(40, 3) == [(0, 16), (16, 32), (32, 40)]


def _cfg(seed=0, **kw):
    from ftkit.train.config import TrainConfig
    from ftkit.train.plan.run_plan import build_plan

    return build_plan(TrainConfig(seed=seed, response_len=6, **kw))  # actors take the run plan


_SAVE_MODEL = """
import sys
from ftkit.model.gpt import build_gpt, configure_determinism, init_local_parallel
from ftkit.tensors.st import write_safetensors_atomic
from ftkit.train.config import TrainConfig
from ftkit.train.plan.run_plan import build_plan
configure_determinism(1)
init_local_parallel("cpu")
for seed in (0, 5):
    model = build_gpt(build_plan(TrainConfig(seed=seed, response_len=6)).model, seed, "cpu")
    write_safetensors_atomic(f"{sys.argv[1]}/seed{seed}.safetensors",
                             {n: p.detach() for n, p in model.named_parameters()})
"""


def _states(tmp_path):
    """``{seed: TP=1 weights}`` of the models of seeds 0 and 5, built in a process of their own."""
    import subprocess
    import sys

    from safetensors.torch import load_file

    subprocess.run([sys.executable, "-c", _SAVE_MODEL, str(tmp_path)], check=True, timeout=300)
    return {seed: load_file(tmp_path / f"seed{seed}.safetensors") for seed in (0, 5)}


@pytest.fixture(scope="module")
def engines(ray_session, tmp_path_factory):
    ray = ray_session
    run_dir = tmp_path_factory.mktemp("engines") / "run"
    cls = ray.remote(num_cpus=0.5)(EngineActor)
    actors = {"a": cls.remote(_cfg(0), str(run_dir), 0), "b": cls.remote(_cfg(0), str(run_dir), 1)}
    yield ray, actors, _states(run_dir.parent), run_dir
    for a in actors.values():
        ray.kill(a)


@pytest.mark.slow
def test_responses_do_not_depend_on_the_engine_split(engines):
    ray, actors, _, _ = engines
    task = AdditionTask(response_len=6)
    prompts = task.prompts(seed=0, rollout=3, count=10).repeat_interleave(4, dim=0)  # 40 samples
    whole, whole_lp = ray.get(actors["a"].generate.remote(prompts, 3, 0))
    assert whole.shape == (40, 6) and whole.dtype == torch.int64
    assert whole_lp.shape == (40, 6) and whole_lp.dtype == torch.float32 and bool((whole_lp <= 0).all())
    assert set(whole.unique().tolist()) <= set(RESPONSE_TOKENS)
    assert len({tuple(r) for r in whole.tolist()}) > 10  # sampled, not one constant answer
    for n_engines in (2, 3):
        ranges = split(40, n_engines)
        parts = [ray.get(actors["ab"[i % 2]].generate.remote(prompts[a:b], 3, a)) for i, (a, b) in enumerate(ranges)]
        assert torch.equal(torch.cat([t for t, _ in parts]), whole)
        assert torch.equal(torch.cat([lp for _, lp in parts]), whole_lp)  # the log-probs too, bit for bit
    assert not torch.equal(ray.get(actors["a"].generate.remote(prompts, 4, 0))[0], whole)  # another rollout


@pytest.mark.slow
def test_load_weights_fingerprints_what_the_engine_holds(engines):
    from ftkit.tensors.fingerprint import fingerprint_tensors

    ray, actors, states, run_dir = engines
    prompts = AdditionTask(response_len=6).prompts(seed=0, rollout=0, count=16)
    before = ray.get(actors["b"].generate.remote(prompts, 0, 0))[0]
    state = states[5]
    total = ray.get(actors["b"].load_weights.remote(state, 7, 2))
    assert total == fingerprint_tensors(state)[0]
    # the loaded weights are really used: other weights, other samples; the own weights back, the same
    assert not torch.equal(ray.get(actors["b"].generate.remote(prompts, 0, 0))[0], before)
    own = ray.get(actors["b"].load_weights.remote(states[0], 8, 3))
    assert own == fingerprint_tensors(states[0])[0] != total
    assert torch.equal(ray.get(actors["b"].generate.remote(prompts, 0, 0))[0], before)
    ray.get(actors["b"].shutdown.remote())
    lines = [json.loads(line) for line in (run_dir / "events" / "engine-r1-i0.jsonl").read_text().splitlines()]
    loaded = [e for e in lines if e["type"] == "engine_weights"]
    assert [e["version"] for e in loaded] == [7, 8]
    assert loaded[0]["total"] == total and loaded[0]["version"] == 7 and loaded[0]["rollout"] == 2
    assert loaded[0]["engine"] == 1 and loaded[0]["params"] == fingerprint_tensors(state)[1]


@pytest.mark.slow
def test_load_weights_refuses_a_state_of_another_model(engines):
    ray, actors, states, _ = engines
    state = dict(states[5])
    state.pop("output_layer.weight")
    with pytest.raises(ray.exceptions.RayTaskError, match="missing"):
        ray.get(actors["a"].load_weights.remote(state, 1, 1))
    state = dict(states[5])
    state["output_layer.weight"] = state["output_layer.weight"][:, :8]
    with pytest.raises(ray.exceptions.RayTaskError, match="output_layer.weight"):
        ray.get(actors["a"].load_weights.remote(state, 1, 1))


@pytest.mark.slow
def test_greedy_decoding_is_fixed_and_leaves_sampling_alone(engines):
    """``generate(greedy=True)`` (the eval_reward path) does not depend on the split, the
    rollout or the sample index, picks only response tokens, and draws no random number: the
    sampled responses of a rollout are the same before and after it. (Engine "b": the test
    above leaves engine "a" with a partial load.)"""
    ray, actors, states, _ = engines
    b = actors["b"]
    ray.get(b.load_weights.remote(states[0], 20, 20))
    prompts = AdditionTask(response_len=6).heldout_prompts(seed=0, count=40)
    sampled = ray.get(b.generate.remote(prompts, 3, 0))[0]
    greedy = ray.get(b.generate.remote(prompts, 3, 0, True))[0]
    assert greedy.shape == (40, 6) and set(greedy.unique().tolist()) <= set(RESPONSE_TOKENS)
    assert torch.equal(ray.get(b.generate.remote(prompts, 9, 17, True))[0], greedy)
    parts = [ray.get(b.generate.remote(prompts[lo:hi], 0, lo, True))[0] for lo, hi in split(40, 3)]
    assert torch.equal(torch.cat(parts), greedy)
    assert not torch.equal(sampled, greedy)  # sampling at temperature 1 is not the argmax
    assert torch.equal(ray.get(b.generate.remote(prompts, 3, 0))[0], sampled)
    broken = dict(states[0])
    broken["output_layer.weight"] = broken["output_layer.weight"].clone()
    broken["output_layer.weight"][EOS] = float("nan")  # one allowed token's logit is NaN everywhere
    ray.get(b.load_weights.remote(broken, 21, 21))
    assert (ray.get(b.generate.remote(prompts, 3, 0, True))[0] == -1).all()  # no answer: eval_reward is NaN
    ray.get(b.load_weights.remote(states[0], 22, 22))


def test_an_engine_that_does_not_answer_in_time_is_failed_like_a_dead_one(monkeypatch):
    """``EnginePool._get``: --step-timeout per call, plus --heal-timeout until the engine first
    answered; a missed deadline is a ``RayError`` (the pool replaces the engine)."""
    import ray

    from ftkit.train.config import TrainConfig
    from ftkit.train.control.engine_pool import EnginePool

    asked: list[float] = []

    def never(ref, timeout=None):
        asked.append(timeout)
        raise ray.exceptions.GetTimeoutError("Get timed out: some object(s) not ready.")

    pool = EnginePool.__new__(EnginePool)  # the deadline logic only: no actors
    pool.cfg = TrainConfig(step_timeout=7, heal_timeout=50)
    pool.fresh = {0}
    monkeypatch.setattr(ray, "get", never)
    with pytest.raises(ray.exceptions.RayError, match=r"engine 0 did not answer within 57s"):
        pool._get(0, object())
    monkeypatch.setattr(ray, "get", lambda ref, timeout=None: asked.append(timeout) or "ok")
    assert pool._get(0, object()) == "ok" and 0 not in pool.fresh  # answered: the start-up bound is spent
    monkeypatch.setattr(ray, "get", never)
    with pytest.raises(ray.exceptions.GetTimeoutError, match=r"within 7s \(--step-timeout\)"):
        pool._get(0, object())
    assert asked == [57, 57, 7]


@pytest.mark.slow
def test_an_engine_dead_after_its_last_use_is_declared_at_shutdown(ray_session, tmp_path):
    """An engine SIGKILLed after its last call: the pool's shutdown cannot flush its log, so the
    driver logs ``engine_failed`` for it (the analyzer excuses only a declared death); the live
    engine flushes and closes its log as always."""
    import os
    import signal

    from ftkit.events.writer import EventWriter
    from ftkit.train.control.engine_pool import EnginePool

    run_dir = tmp_path / "run"
    driver = EventWriter(run_dir / "events", run="run", role="driver")
    pool = EnginePool(_cfg(0, engines=2), str(run_dir), events=driver)
    pool.ready()
    pid = ray_session.get(pool.actors[1].__ray_call__.remote(lambda actor: os.getpid()))
    os.kill(pid, signal.SIGKILL)
    pool.shutdown(30.0)
    driver.close()
    lines = [json.loads(x) for x in (run_dir / "events" / "driver-i0.jsonl").read_text().splitlines()]
    failed = [e for e in lines if e["type"] == "engine_failed"]
    assert [(e["engine"], e["incarnation"]) for e in failed] == [(1, 0)]
    assert failed[0]["reason"].startswith("at shutdown: ")
    closed = [json.loads(x)["type"] for x in (run_dir / "events" / "engine-r0-i0.jsonl").read_text().splitlines()]
    assert closed[-1] == "log_closed"


@pytest.mark.slow
def test_weights_whose_object_was_lost_are_exported_again_not_the_engine_restarted(ray_session, tmp_path):
    """``EnginePool.load`` of a weights object that is gone (here: its owner died, as the
    exporting cell's node would take it) asks ``reexport`` for the same version once and
    loads that, without restarting the engine; a re-export with another fingerprint total than
    the one sent fails the run."""
    from ftkit.engines.protocol import expected_weights
    from ftkit.events.writer import EventWriter
    from ftkit.train.control.engine_pool import EnginePool
    from ftkit.train.control.run_end import RunFailed

    ray = ray_session
    state = _states(tmp_path)[0]

    @ray.remote(num_cpus=0)
    class Owner:
        def put(self, tensors):
            return [ray.put(tensors)]  # in a list: the ref stays this actor's, not the caller's

    def lost_weights():
        owner = Owner.remote()
        (ref,) = ray.get(owner.put.remote(state))
        ray.kill(owner, no_restart=True)
        for _ in range(200):  # ray.kill returns before the owner is gone
            try:
                ray.get(ref, timeout=30)
            except ray.exceptions.ObjectLostError:
                return ref
            time.sleep(0.05)
        raise AssertionError("the weights object outlived its owner")

    run_dir = tmp_path / "run"
    driver = EventWriter(run_dir / "events", run="run", role="driver")
    asked: list[int] = []
    again = {"total": None}

    def reexport(version):
        asked.append(version)
        return ray.put(state), again["total"]

    pool = EnginePool(_cfg(0), str(run_dir), events=driver, reexport=reexport)
    try:
        pool.ready()
        fmt = pool.weights_format
        total = again["total"] = expected_weights(state, fmt.dtype, fmt.signed_zeros)[0]
        assert pool.load(lost_weights(), 3, total) == [total]
        assert asked == [3] and pool.restarts == 0 and pool.weights[1:] == (3, total)
        again["total"] = "0" * 32  # the cells would hold other weights than the ones sent
        with pytest.raises(RunFailed, match="exported again have fingerprint total 0{32}, not the"):
            pool.load(lost_weights(), 4, total)
        assert asked == [3, 4] and pool.restarts == 0
    finally:
        pool.shutdown(30.0)
        driver.close()
    lines = [json.loads(x) for x in (run_dir / "events" / "engine-r0-i0.jsonl").read_text().splitlines()]
    assert [e["version"] for e in lines if e["type"] == "engine_weights"] == [3]
    drv = [json.loads(x)["type"] for x in (run_dir / "events" / "driver-i0.jsonl").read_text().splitlines()]
    assert "engine_failed" not in drv
