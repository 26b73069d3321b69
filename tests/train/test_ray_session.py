"""``connect_ray``: a SIGTERM while Ray starts is an interruption (exit 143), not Ray's exit 15."""

from __future__ import annotations

import signal

import pytest

from ftkit.train.config import TrainConfig
from ftkit.train.control.ray_session import connect_ray
from ftkit.train.control.run_end import RunInterrupted


def test_ray_init_s_own_sigterm_exit_becomes_an_interruption(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    shut: list[bool] = []

    def init(**kwargs: object) -> None:
        raise SystemExit(signal.SIGTERM)  # what ray.init's handler does (sys.exit(signum))

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: shut.append(True))
    with pytest.raises(RunInterrupted) as info:
        connect_ray(TrainConfig(), rearm=lambda: pytest.fail("rearmed after a failed start"))
    assert info.value.exit_code == 143 and "while Ray was starting" in info.value.message and shut == [True]


def test_other_exits_and_a_started_ray_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    rearmed: list[bool] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: None)
    assert connect_ray(TrainConfig(), rearm=lambda: rearmed.append(True)) is True and rearmed == [True]

    def init(**kwargs: object) -> None:
        raise SystemExit(3)

    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(SystemExit):
        connect_ray(TrainConfig())


def test_raylet_notices_never_reach_stdout_and_worker_deaths_are_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's driver prints the raylet's notices on stdout, which carries ftkit's data only."""
    import ray._private.worker as ray_worker

    from ftkit.train.control import ray_session

    printed: list[dict] = []
    monkeypatch.setattr(ray_worker, "print_to_stdstream", lambda data, ignore_prefix: printed.append(data))
    ray_session._route_raylet_notices()
    ray_session._route_raylet_notices()  # installed once, not wrapped twice
    died = "A worker died or was killed while executing a task by an unexpected system error."
    ray_worker.print_to_stdstream({"pid": "raylet", "lines": [died], "is_err": False}, False)
    assert printed == []
    ray_worker.print_to_stdstream({"pid": "raylet", "lines": [died, "out of disk"], "is_err": False}, False)
    assert printed == [{"pid": "raylet", "lines": ["out of disk"], "is_err": True}]
    worker_line = {"pid": 123, "lines": ["hello"], "is_err": False}
    ray_worker.print_to_stdstream(worker_line, False)
    assert printed[-1] is worker_line


def test_an_interruption_caught_by_ray_s_deserialisation_logs_no_traceback() -> None:
    import logging

    from ftkit.train.control.ray_session import RAY_LOGGER, _drop_interruption_tracebacks

    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append  # type: ignore[method-assign]
    logging.getLogger(RAY_LOGGER).addHandler(handler)  # as ray's stderr handler
    try:
        _drop_interruption_tracebacks()
        _drop_interruption_tracebacks()  # idempotent: one filter
        assert len(handler.filters) == 1
        log = logging.getLogger("ray._private.serialization")
        for exc in (RunInterrupted(signal.SIGTERM), ValueError("a real unpickling failure")):
            try:
                raise exc
            except Exception as caught:  # what ray's deserialize_objects does: logger.exception(e)
                log.exception(caught)
    finally:
        logging.getLogger(RAY_LOGGER).removeHandler(handler)
    assert [r.exc_info[1].__class__ for r in seen if r.exc_info] == [ValueError]


def test_a_node_that_did_not_start_in_time_is_exit_1_with_a_retry_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen under load: Ray's raylet did not register within its 30 s; not a bug in ftkit."""
    import ray

    from ftkit.train.control.run_end import RunFailed

    shut: list[bool] = []

    def init(**kwargs: object) -> None:
        raise Exception(  # what ray._private.node raises, a bare Exception
            "The current node timed out during startup. This could happen because some of the raylet "
            "failed to startup or the GCS has become overloaded."
        )

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: shut.append(True))
    with pytest.raises(RunFailed) as info:
        connect_ray(TrainConfig())
    assert info.value.exit_code == 1 and "did not start in time" in info.value.message
    assert "run the same command again" in (info.value.hint or "") and shut == [True]


def test_any_other_exception_of_ray_init_is_not_disguised(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    def init(**kwargs: object) -> None:
        raise Exception("something else")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(Exception, match="something else"):
        connect_ray(TrainConfig())
