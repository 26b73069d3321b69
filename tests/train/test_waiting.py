"""``RefWaiter`` over fake refs and a fake clock: Ray's death notices fail a dead cell at once,
and a survivor still waiting on a dead peer at the deadline is blocked, not hung (issue 25
item 3: a healthy cell declared hung under load and every cell restarted from a checkpoint)."""

from __future__ import annotations

import pytest
from fakecells import FakeRef, FakeRefs, never

from ftkit.train.control.waiting import DEATH_POLL_S, MARGIN_S


def _probe(refs: FakeRefs, deaths: dict[int, float]):
    return lambda cell: "the actor died (fake)" if refs.now >= deaths.get(cell, float("inf")) else None


def test_a_cell_ray_reports_dead_fails_at_once_not_at_the_deadline() -> None:
    refs = FakeRefs()
    waiter = refs.waiter(grace_s=10.0)
    got = waiter.wait({0: [never()], 1: [never()]}, 60.0, dead=_probe(refs, {1: 0.3}))
    assert got.failed[1].startswith("dead: the actor died")
    # cell 1 found within one probe slice; cell 0, blocked on it, waits one grace, then is blocked
    assert refs.now == pytest.approx(0.3 + DEATH_POLL_S + 10.0 + MARGIN_S, abs=DEATH_POLL_S)
    assert 0 not in got.failed and 0 in got.collective and got.blocked[0].startswith("cell 1 (dead")


def test_a_survivor_pending_after_a_peer_failed_is_blocked_not_hung() -> None:
    refs = FakeRefs()
    waiter = refs.waiter(grace_s=10.0)
    got = waiter.wait({0: [never()], 1: [FakeRef(problem=("dead", "gone"), at=1.0)]}, 60.0)
    assert got.failed == {1: "dead: gone"} and got.collective == {0} and "cell 1" in got.blocked[0]
    assert refs.now == pytest.approx(1.0 + 10.0 + MARGIN_S)


def test_without_a_failed_peer_a_silent_cell_is_still_hung() -> None:
    refs = FakeRefs()
    waiter = refs.waiter(grace_s=10.0)
    got = waiter.wait({0: [FakeRef("ok", at=1.0)], 1: [never()]}, 60.0, dead=_probe(refs, {}))
    assert got.failed[1].startswith("hung: no answer after 13.0s") and not got.blocked


def test_a_named_peer_found_dead_ends_the_wait_at_once() -> None:
    """A heal recipient's wait names its donor: the donor's death ends it within a probe slice."""
    refs = FakeRefs()
    waiter = refs.waiter(grace_s=10.0)
    got = waiter.wait({2: [never()]}, 60.0, dead=_probe(refs, {0: 4.0}), peers=(0,))
    assert refs.now == pytest.approx(4.0, abs=DEATH_POLL_S + 1e-9)
    assert got.collective == {2} and got.blocked[2].startswith("cell 0 (") and not got.failed


def test_a_death_probe_into_a_gcs_that_does_not_answer_gives_up_and_blocks_no_later_probe(monkeypatch) -> None:
    """A lookup in a dead GCS never returns (measured: over 110 s): the probe must return
    None instead of holding the driver until Ray's client ends it at 60 s, and while that
    lookup is stuck later probes do not start another one."""
    import threading
    import types

    from ray._private import state

    from ftkit.train.control import waiting

    release, calls = threading.Event(), []

    def stuck(actor_id: str) -> dict:
        calls.append(actor_id)
        release.wait()
        return {"State": "DEAD"}

    monkeypatch.setattr(waiting, "PROBE_TIMEOUT_S", 0.05)
    monkeypatch.setattr(state.state, "actor_table", stuck)
    actor = types.SimpleNamespace(_actor_id=types.SimpleNamespace(hex=lambda: "a1"))
    assert waiting.ray_actor_dead(actor) is None  # gave up on the stuck lookup
    assert waiting.ray_actor_dead(actor) is None and calls == ["a1"]  # no second lookup while it is stuck
    release.set()
    while waiting._probing.locked():  # the stuck lookup returns once the GCS answers
        release.wait(0.01)
    monkeypatch.setattr(state.state, "actor_table", lambda actor_id: {"State": "DEAD"})
    assert waiting.ray_actor_dead(actor) == "the actor died (Ray's actor table reports it DEAD)"


@pytest.mark.slow
def test_failed_flushes_names_the_dead_and_the_silent_owners(ray_session) -> None:
    """Real actors: one flushes, one was SIGKILLed after its last use, one does not answer in time."""
    import os
    import signal
    import time

    from ftkit.train.control.waiting import failed_flushes

    ray = ray_session

    @ray.remote(num_cpus=0.1)
    class Owner:
        def pid(self) -> int:
            return os.getpid()

        def flush(self, wait_s: float) -> None:
            time.sleep(wait_s)

    owners = [Owner.remote() for _ in range(3)]
    pids = ray.get([o.pid.remote() for o in owners])
    os.kill(pids[1], signal.SIGKILL)
    got = failed_flushes({i: [o.flush.remote(60.0 if i == 2 else 0.0)] for i, o in enumerate(owners)}, 5.0)
    assert set(got) == {1, 2}
    assert "ActorDiedError" in got[1] or "died" in got[1].lower()
    assert got[2] == "did not flush its event log within 5s"
    for o in owners:
        ray.kill(o)
