"""``--reward-timeout`` (issue 40 item 5): a reward call that does not return is stopped in time
(a sleep, a busy loop, a retry loop that swallows every exception), names the plug-in, the
sample and its prompt, and leaves nothing behind (no SIGALRM handler, timer or trace function);
a plug-in's own ``signal.alarm`` still works; the pre-Ray check is limited too; normal rewards
score the same with and without a limit."""

from __future__ import annotations

import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from ftkit.tasks.addition import EOS, AdditionTask
from ftkit.tasks.protocols import RewardSample
from ftkit.tasks.rewards import RewardError, load_reward, score, score_one
from ftkit.tasks.time_limit import TimeLimitExceeded, call_within
from ftkit.train.rl.rewards import check_reward

PLUGIN = """
import signal, time
def sleeps(**kwargs):
    time.sleep(3600)
def spins(**kwargs):
    while True:
        pass
def swallows(**kwargs):
    while True:
        try:
            time.sleep(3600)
        except:  # noqa: E722 - a retry loop that takes everything
            pass
def turns_it_into_its_own(**kwargs):
    try:
        time.sleep(3600)
    except BaseException:
        raise ValueError("gave up")
def late(**kwargs):
    try:
        time.sleep(3600)
    except BaseException:
        return 1.0
def length(response, **kwargs):
    return float(len(response))
def own_alarm(response, **kwargs):
    class Slow(Exception):
        pass
    def on_alarm(signum, frame):
        raise Slow()
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(30)
    try:
        return float(len(response)) + 0.5
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
"""


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "rw_timeout.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _sample() -> RewardSample:
    return AdditionTask(response_len=4).reward_sample(torch.tensor([1, 8, 3, 9, 4]), torch.tensor([5, 12, EOS, 0]))


@pytest.fixture
def clean() -> Iterator[None]:
    """Nothing of the limit is left after the test: the SIGALRM handler that was there before
    (pytest-timeout's, under pytest), its timer still running if it was, no trace function."""
    handler, (timer, _) = signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL)
    yield
    assert signal.getsignal(signal.SIGALRM) is handler
    left, _ = signal.getitimer(signal.ITIMER_REAL)
    assert (left > 0) if timer > 0 else left == 0.0
    assert sys.gettrace() is None or "coverage" in type(sys.gettrace()).__module__


@pytest.mark.parametrize(
    ("name", "most_s"), [("sleeps", 1.0), ("spins", 1.0), ("swallows", 2.5), ("turns_it_into_its_own", 1.0)]
)
def test_a_call_that_does_not_return_is_stopped_and_named(
    plugin_dir: Path, clean: None, name: str, most_s: float
) -> None:
    start = time.monotonic()
    with pytest.raises(RewardError) as info:
        score_one(load_reward(f"rw_timeout:{name}"), 5, _sample(), timeout=0.3)
    took = time.monotonic() - start
    assert 0.3 <= took < most_s, took  # a swallowed first alarm costs one REFIRE_S more
    assert info.value.message == (
        f"reward 'rw_timeout:{name}' did not return within 0.3 s (--reward-timeout) on sample 5 (prompt '3 + 4 =')"
    )
    assert "--reward-timeout SECONDS" in (info.value.hint or "")


def test_a_call_that_swallows_the_limit_and_returns_late_is_still_too_late(plugin_dir: Path, clean: None) -> None:
    with pytest.raises(RewardError, match="did not return within 0.2 s"):
        score_one(load_reward("rw_timeout:late"), 0, _sample(), timeout=0.2)


def test_normal_rewards_score_the_same_with_a_limit_and_a_plug_in_s_own_alarm_works(
    plugin_dir: Path, clean: None
) -> None:
    samples = [_sample()] * 50
    length = load_reward("rw_timeout:length")
    assert score(length, samples, 5.0) == score(length, samples, None) == [2.0] * 50
    assert score(load_reward("rw_timeout:own_alarm"), samples, 5.0) == [2.5] * 50  # its alarm(0) ends ours early


def test_an_outer_timer_goes_on_with_what_was_left_of_it(plugin_dir: Path) -> None:
    fired: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
    before, _ = signal.getitimer(signal.ITIMER_REAL)  # pytest-timeout's, under pytest
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        assert score_one(load_reward("rw_timeout:length"), 0, _sample(), timeout=5.0) == 2.0
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0.0 < left <= 0.5
        time.sleep(0.7)
        assert fired == [signal.SIGALRM]  # the caller's own handler, back in place, got it
    finally:
        signal.signal(signal.SIGALRM, previous)
        signal.setitimer(signal.ITIMER_REAL, before)


def test_outside_the_main_thread_the_call_runs_without_a_limit() -> None:
    out: list[object] = []
    worker = threading.Thread(target=lambda: out.append(call_within(0.01, lambda: time.sleep(0.1) or "done")))
    worker.start()
    worker.join()
    assert out == ["done"]


def test_the_pre_ray_check_of_a_plug_in_that_never_returns_is_stopped(plugin_dir: Path) -> None:
    with pytest.raises(RewardError, match=re.escape("reward 'rw_timeout:sleeps' did not return within 0.2 s")):
        check_reward("rw_timeout:sleeps", AdditionTask(4), seed=0, timeout=0.2)
    with pytest.raises(TimeLimitExceeded):
        call_within(0.1, lambda: time.sleep(5))
