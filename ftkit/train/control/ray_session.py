"""The driver's Ray session and its rendezvous: connect (or start a local Ray), the TCPStore
the cells meet at, shut down; plus ``plain_line`` for Ray's coloured error texts.

``connect_ray(cfg)`` joins ``cfg.cluster.ray_address`` (probed first: a dead address is exit 2 within
seconds) or starts a local instance with ``LOCAL_RAY_CPUS`` logical CPUs, Ray's logs kept
off the driver's stderr (that is ftkit's progress); it returns whether this call initialised
Ray, which ``disconnect`` then shuts down.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import re
import signal
from collections.abc import Callable, Iterator
from typing import Any

from ftkit.errors import ConfigError
from ftkit.train.config import STARTUP_TIMEOUT_S, TrainConfig

#: Logical CPUs of the local Ray instance (more than the cores: actors ask for fractions).
LOCAL_RAY_CPUS = 8
#: Ray's notice that a local instance it starts has token authentication on (noise on the stderr of
#: a run whose Ray ftkit starts and stops itself).
TOKEN_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"
#: The raylet's notices of a worker that died: the deaths ftkit detects and logs itself (``cell_state``,
#: ``engine_failed``), printed by Ray's driver on *stdout*, which carries ftkit's data only.
_WORKER_DIED = re.compile(r"worker died|was killed", re.IGNORECASE)
#: The logger whose handlers print every Ray logger's records (Ray's loggers do not reach the root).
RAY_LOGGER = "ray"


def connect_ray(cfg: TrainConfig, rearm: Callable[[], None] = lambda: None) -> bool:
    """Make sure Ray is initialised; returns whether this call did it (and must shut it down).

    A signal that lands while Ray starts is only recorded (``signals_deferred``: an exception
    raised in the middle of Ray's start-up aborted the driver) and becomes the caller's
    ``RunInterrupted`` (exit 128 + the signal) once ``ray.init`` returns, after the half-started
    Ray and every process it spawned are stopped (``disconnect``). ``ray.init`` would install its
    own SIGTERM handlers (``sys.exit``); they are kept out while it runs, and ``rearm`` is called
    right after it to put the caller's back."""
    import ray

    if ray.is_initialized():
        return False
    if cfg.cluster.ray_address:  # a dead address is exit 2 within seconds, not a minute of retries
        from ftkit.train.control.ray_probe import probe_ray_address

        probe_ray_address(cfg.cluster.ray_address, timeout_s=5.0)
    quiet: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}  # stderr is for ftkit's progress
    from ftkit.train.control.run_end import RunInterrupted, signals_deferred

    _Spawned.before = {p.pid for p in descendants()}
    try:
        with signals_deferred(), _own_signal_handlers():
            if cfg.cluster.ray_address:
                ray.init(address=cfg.cluster.ray_address, **quiet)
            else:
                with _quiet_logger(TOKEN_NOTICE_LOGGER):
                    ray.init(address="local", num_cpus=LOCAL_RAY_CPUS, include_dashboard=False, **quiet)
        rearm()
        _route_raylet_notices()
        _drop_interruption_tracebacks()
    except (RunInterrupted, SystemExit) as exc:
        if isinstance(exc, SystemExit) and exc.code != signal.SIGTERM:
            raise
        signum = exc.signum if isinstance(exc, RunInterrupted) else signal.SIGTERM
        with contextlib.suppress(Exception):
            disconnect(own_ray=True)
        raise RunInterrupted(signum, started=False) from None
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = cfg.cluster.ray_address or "a local Ray instance"
        raise ConfigError(
            plain_line(f"cannot connect to {where}: {exc}"),
            hint="check the address (ray start --head prints it) or omit --ray-address; a cluster "
            "with token authentication also needs RAY_AUTH_MODE=token here",
        ) from None
    return True


_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def plain_line(text: str) -> str:
    """The first line of ``text`` without terminal colour codes (Ray colours its exception
    texts; the event log and status.json hold plain text)."""
    lines = _ANSI.sub("", text).splitlines()
    return lines[0] if lines else ""


def host_store() -> Any:
    """A ``TCPStore`` server on this node's Ray IP and a free port (``.host``, ``.port``)."""
    import ray
    import torch.distributed as dist

    host = ray.util.get_node_ip_address()
    timeout = datetime.timedelta(seconds=STARTUP_TIMEOUT_S)
    return dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timeout)


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@contextlib.contextmanager
def _quiet_logger(name: str) -> Iterator[None]:
    """Warnings of logger ``name`` are not shown inside the block."""
    log = logging.getLogger(name)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _route_raylet_notices() -> None:
    """Ray's driver prints the raylet's error notices on stdout (``print_to_stdstream`` with
    ``is_err`` false): drop the worker deaths (see ``_WORKER_DIED``) and send any other notice to
    stderr. Idempotent; a Ray without that function is left alone."""
    import ray._private.worker as ray_worker

    original = getattr(ray_worker, "print_to_stdstream", None)
    if original is None or getattr(original, "ftkit_routed", False):
        return

    def route(data: dict[str, Any], ignore_prefix: bool) -> None:
        if data.get("pid") == "raylet":
            lines = [line for line in data.get("lines", []) if not _WORKER_DIED.search(str(line))]
            if not lines:
                return
            data = {**data, "lines": lines, "is_err": True}
        original(data, ignore_prefix)

    route.ftkit_routed = True  # type: ignore[attr-defined]  # marks the wrapper: installed once
    ray_worker.print_to_stdstream = route


class _NotAnInterruption(logging.Filter):
    """Drops a log record whose exception is ftkit's ``RunInterrupted``."""

    def filter(self, record: logging.LogRecord) -> bool:
        from ftkit.train.control.run_end import RunInterrupted

        return not (record.exc_info and isinstance(record.exc_info[1], RunInterrupted))


def _drop_interruption_tracebacks() -> None:
    """Ray code that catches any ``Exception`` in the driver's main thread logs it with its
    traceback: its object deserialisation does so for the ``RunInterrupted`` of a signal that
    lands while it unpickles a result, and returns a ``RaySystemError`` that the driver then reads
    as the recorded interruption (``pending_interruption``). That traceback is not a bug and stays
    off stderr (which then holds the run's one ``Error:`` line): every handler of ``RAY_LOGGER``
    drops such records. Idempotent."""
    for handler in logging.getLogger(RAY_LOGGER).handlers:
        if not any(isinstance(f, _NotAnInterruption) for f in handler.filters):
            handler.addFilter(_NotAnInterruption())


@contextlib.contextmanager
def _own_signal_handlers() -> Iterator[None]:
    """While Ray starts, its calls that install SIGTERM handlers (``sys.exit`` in the driver,
    the local node's "kill every process, exit 1") do nothing: the caller's handlers stay."""
    import ray._private.utils as ray_utils

    install = getattr(ray_utils, "set_sigterm_handler", None)
    if install is None:  # another Ray: its handlers are put back by ``rearm`` afterwards
        yield
        return
    ray_utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = install


def disconnect(own_ray: bool, gcs_lost: bool = False) -> None:
    """Shut Ray down if this run started (or joined) it; a local Ray that this process started
    leaves no process behind (``stop_descendants``: its dashboard and runtime-env agents
    outlived it by a minute or more). With its GCS gone, ``ray.shutdown``
    would wait on it until Ray's client ends the process (about a minute after the loss), at
    exit too: it is skipped and unregistered; the local Ray's raylet dies with this process."""
    import ray

    if gcs_lost:
        import atexit

        from ftkit import hard_exit

        atexit.unregister(ray.shutdown)
        hard_exit.request()  # Ray's client crashes at interpreter exit without its GCS
        return
    if own_ray:
        spawned = [p for p in descendants() if p.pid not in _Spawned.before]
        ray.shutdown()
        stop_descendants(spawned)


class _Spawned:
    """The descendants this process had before ``connect_ray`` started Ray: not Ray's, never
    stopped by ``disconnect``."""

    before: set[int] = set()


def descendants() -> list[Any]:
    """This process's descendants now (``psutil.Process``es): a local Ray's GCS, raylet, workers
    and agents. Taken before Ray shuts down, when they are still children: afterwards the agents
    are orphans that no longer say whose they were."""
    import psutil

    try:
        return list(psutil.Process().children(recursive=True))
    except psutil.Error:
        return []


def stop_descendants(procs: list[Any], grace_s: float = 5.0) -> None:
    """SIGTERM, then after ``grace_s`` SIGKILL, whichever of ``procs`` (from ``descendants``)
    still run. Only processes this process started are ever signalled: psutil checks that a pid
    still names the same process (its creation time) before it signals it."""
    import psutil

    alive = [p for p in procs if p.is_running()]
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, left = psutil.wait_procs(alive, timeout=grace_s)
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(left, timeout=grace_s)


class GcsWatch:
    """Watches, from a daemon thread, whether the Ray GCS the driver is connected to answers.

    Actor calls go straight to the actors, so a run whose GCS died trains on until Ray's own
    client ends the driver process (about 60 s later: no ``run_finished``, no ``status.json``).
    ``lost()`` says for how long the GCS has not answered once that is ``grace_s`` or more (a GCS
    only slow under load is not lost; Ray's client gives up at 60 s), so the driver can end the
    run itself first. A Ray without the probe call (another version) is never reported lost.
    """

    def __init__(self, interval_s: float = 1.0, timeout_s: float = 5.0, grace_s: float = 15.0) -> None:
        import threading

        self.interval_s, self.timeout_s, self.grace_s = interval_s, timeout_s, grace_s
        self._since: float | None = None  # monotonic time of the first unanswered probe
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="ftkit-gcs-watch", daemon=True)

    def start(self) -> GcsWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def lost(self) -> float | None:
        """Seconds the GCS has not answered, once at least ``grace_s``; else ``None``."""
        import time

        since = self._since
        silent = None if since is None else time.monotonic() - since
        return silent if silent is not None and silent >= self.grace_s else None

    def _watch(self) -> None:
        import time

        import ray

        try:
            probe = ray._private.worker.global_worker.gcs_client.internal_kv_get  # type: ignore[attr-defined]
        except AttributeError:  # pragma: no cover - a Ray without this client API
            return
        while not self._stop.wait(self.interval_s):
            try:
                probe(b"ftkit-gcs-probe", None, timeout=self.timeout_s)
            except ray.exceptions.RpcError:
                if self._since is None:
                    self._since = time.monotonic() - self.timeout_s
            except Exception:  # pragma: no cover - the probe itself broke: say nothing
                return
            else:
                self._since = None
