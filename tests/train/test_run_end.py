"""How a run ends: exit codes of the non-bug failures, status.json, signals raise RunInterrupted."""

import json
import logging
import os
import signal

import pytest

from ftkit.train.control.run_end import RunFailed, RunInterrupted, interruption, signals_interrupt, write_status


def test_exit_codes_are_1_and_128_plus_the_signal():
    assert RunFailed("x").exit_code == 1
    assert RunInterrupted(signal.SIGINT).exit_code == 130
    err = RunInterrupted(signal.SIGTERM)
    assert err.exit_code == 143 and "SIGTERM" in err.message and "bug" not in err.message
    assert RunInterrupted(signal.SIGHUP).exit_code == 129


def test_status_json(tmp_path):
    write_status(tmp_path, "failed", "1 live cell(s) left", 1, 3, 8)
    doc = json.loads((tmp_path / "status.json").read_text())
    assert {k: doc[k] for k in ("status", "reason", "exit_code", "steps_committed", "steps_total")} == {
        "status": "failed",
        "reason": "1 live cell(s) left",
        "exit_code": 1,
        "steps_committed": 3,
        "steps_total": 8,
    }
    assert not list(tmp_path.glob(".*tmp"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_inside_the_block_raises_once_and_handlers_come_back(sig):
    before = signal.getsignal(sig)
    with pytest.raises(RunInterrupted) as info, signals_interrupt():
        os.kill(os.getpid(), sig)  # Python runs the handler at the next bytecode
        signal.pause()
    assert info.value.signum == sig
    assert signal.getsignal(sig) is before


def test_an_interruption_wrapped_by_a_c_extension_is_still_one():
    """What Ray's Cython ``CoreWorker.wait`` does with an exception a signal handler raised in it."""
    stop = RunInterrupted(signal.SIGHUP)
    try:
        try:
            raise stop
        except RunInterrupted as exc:
            raise SystemError("<cyfunction CoreWorker.wait> returned a result with an exception set") from exc
    except SystemError as wrapped:
        assert interruption(wrapped) is stop
    assert interruption(ValueError("x")) is None


def _logged_like_rays_deserialiser(first: BaseException) -> None:
    """What ``ray._private.serialization.deserialize_objects`` does when an exception (here
    ``first``, e.g. the signal handler's) is raised inside it: another exception during the
    handling, caught there and logged with ``logger.exception``."""
    try:
        try:
            raise first
        except BaseException:
            raise RuntimeError("DeserializationError")  # noqa: B904 - its context is `first`, as in Ray
    except RuntimeError as e:
        logging.getLogger("ray._private.serialization").exception(e)


def test_rays_log_of_the_handlers_interruption_is_dropped_inside_the_block():
    """A signal that lands inside Ray's deserialiser must not print Ray's traceback next to the
    run's one ``Error:`` line (tests/train/test_signals.py checks the whole run). The records are
    read on Ray's logger itself: once Ray ran in this process, its loggers do not propagate."""
    records: list[logging.LogRecord] = []
    collect = logging.Handler(logging.ERROR)
    collect.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("ray._private.serialization")
    logger.addHandler(collect)
    try:
        with signals_interrupt():
            _logged_like_rays_deserialiser(RunInterrupted(signal.SIGTERM))
            assert records == []
            _logged_like_rays_deserialiser(ValueError("a real deserialisation failure"))
            assert len(records) == 1  # anything else is still Ray's to log
        _logged_like_rays_deserialiser(RunInterrupted(signal.SIGTERM))
        assert len(records) == 2  # outside the block the filter is gone
    finally:
        logger.removeHandler(collect)


def test_a_failure_of_ray_itself_is_a_run_failure_not_a_bug():
    """Ray's system errors (a placement group removed under a restart when the only node's raylet
    died, an object lost) end the run with exit 1 and a resume hint; an exception of ftkit's own
    code inside an actor (RayTaskError) and anything not Ray's stay what they are."""
    import ray.exceptions as rex

    from ftkit.train.control.run_end import ray_failure

    failed = ray_failure(rex.TaskPlacementGroupRemoved())
    assert isinstance(failed, RunFailed) and failed.exit_code == 1
    assert "TaskPlacementGroupRemoved" in failed.message and "--resume" in failed.hint
    assert "\n" not in failed.message
    assert isinstance(ray_failure(rex.ObjectLostError("ab" * 14, "owner", "call site")), RunFailed)
    assert ray_failure(rex.RayTaskError("fn", "Traceback ...", ValueError("bug"))) is None
    assert ray_failure(ValueError("bug")) is None
