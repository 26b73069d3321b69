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

    ``ray.init`` runs in a thread of its own (``_init_in_thread``) while the main thread only
    waits for it, so a signal stops the start at once, however long Ray takes (35-52 s on a
    loaded machine): the processes Ray spawned so far are stopped, the process is marked for a
    hard exit (``ftkit.hard_exit``: Ray's half-started client must not run the interpreter's
    exit) and the caller gets ``RunInterrupted`` (exit 128 + the signal, nothing written). A
    local node that did not come up in time (Ray's "timed out during startup", seen under load)
    is ``RunFailed`` (exit 1) with the hint to run again; an address that cannot be joined is a
    ``ConfigError`` (exit 2). ``ray.init`` would install its own SIGTERM handlers (``sys.exit``);
    they are kept out while it runs, and ``rearm`` is called right after it to put the caller's
    back."""
    import ray

    if ray.is_initialized():
        return False
    if cfg.cluster.ray_address:  # a dead address is exit 2 within seconds, not a minute of retries
        from ftkit.train.control.ray_probe import probe_ray_address

        probe_ray_address(cfg.cluster.ray_address, timeout_s=5.0)
    quiet: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}  # stderr is for ftkit's progress
    from ftkit.train.control.run_end import RunFailed, RunInterrupted, interruption

    _Spawned.before = {p.pid for p in descendants()}
    _subreaper(True)  # what a local Ray's dying raylet orphans comes here: see ``stop_spawned``
    try:
        with _own_signal_handlers():
            if cfg.cluster.ray_address:
                _init_in_thread(address=cfg.cluster.ray_address, **quiet)
            else:
                with _quiet_logger(TOKEN_NOTICE_LOGGER):
                    _init_in_thread(address="local", num_cpus=LOCAL_RAY_CPUS, include_dashboard=False, **quiet)
        if cfg.cluster.ray_address:  # a joined cluster's processes are not this process's
            _subreaper(False)
        rearm()
        _route_raylet_notices()
        _drop_interruption_tracebacks()
    except (RunInterrupted, SystemExit) as exc:
        if isinstance(exc, SystemExit) and exc.code != signal.SIGTERM:
            raise
        signum = exc.signum if isinstance(exc, RunInterrupted) else signal.SIGTERM
        _stop_half_started()
        raise RunInterrupted(signum, started=False) from None
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = cfg.cluster.ray_address or "a local Ray instance"
        raise ConfigError(
            plain_line(f"cannot connect to {where}: {exc}"),
            hint="check the address (ray start --head prints it) or omit --ray-address; a cluster "
            "with token authentication also needs RAY_AUTH_MODE=token here",
        ) from None
    except Exception as exc:
        stopped = interruption(exc)
        if stopped is not None:  # Ray wrapped the signal's exception
            _stop_half_started()
            raise RunInterrupted(stopped.signum, started=False) from None
        if NODE_START_TIMEOUT not in str(exc):
            raise
        _stop_half_started()
        raise RunFailed(
            f"Ray's node did not start in time: {plain_line(str(exc))}",
            hint="the machine was too loaded for Ray to start; nothing was written: run the same command again",
        ) from None
    return True


#: Ray's exception text when its local node (raylet) does not register in time (``ray._private.node``).
NODE_START_TIMEOUT = "timed out during startup"


class _InitThread:
    """The thread that ran ``ray.init``; it never ends while the process runs: Ray starts its
    GCS and raylet with ``PR_SET_PDEATHSIG``, which Linux sends when the *thread* that spawned
    them ends."""

    thread: Any = None
    initialising = False


def _init_in_thread(**kwargs: Any) -> None:
    """``ray.init(**kwargs)`` in a daemon thread that then parks; the main thread waits for it in
    short joins, so a signal handler runs (and may raise) within a fraction of a second. Ray's
    exception, if any, is raised here."""
    import threading

    import ray

    done = threading.Event()
    box: dict[str, BaseException] = {}

    def run() -> None:
        try:
            ray.init(**kwargs)
        except BaseException as exc:  # handed to the main thread
            box["error"] = exc
        finally:
            _InitThread.initialising = False
            done.set()
        threading.Event().wait()  # park: see ``_InitThread``

    _InitThread.initialising = True
    _InitThread.thread = threading.Thread(target=run, name="ftkit-ray-init", daemon=True)
    with _quiet_thread_warning():
        _InitThread.thread.start()
        while not done.wait(0.1):
            pass
    if "error" in box:
        raise box["error"]


@contextlib.contextmanager
def _quiet_thread_warning() -> Iterator[None]:
    """Ray warns that it sets no SIGTERM handler off the main thread: ftkit's are set."""

    def keep(record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()

    log = logging.getLogger("ray._private.worker")
    log.addFilter(keep)
    try:
        yield
    finally:
        log.removeFilter(keep)


def _stop_half_started() -> None:
    """After a start that did not complete: shut down the Ray this process started, or, while
    ``ray.init`` still runs in its thread, stop every process it spawned and ask for a hard exit
    (``ftkit.hard_exit``)."""
    if not _InitThread.initialising:
        with contextlib.suppress(Exception):
            disconnect(own_ray=True)
        return
    from ftkit import hard_exit

    _silence_ray_threads()
    stop_spawned(grace_s=2.0)
    hard_exit.request()


def _silence_ray_threads() -> None:
    """From now on, an exception in one of Ray's own background threads (``ray_listen_error_messages``,
    ``ray_print_logs``: they lose their GCS when ``stop_spawned`` stops it under a half-done
    ``ray.init``) is not printed: its traceback would be noise on the user's stderr next to the
    one line that says why the run stopped. Every other thread's exception still is."""
    import threading

    previous = threading.excepthook

    def hook(args: Any) -> None:
        if args.thread is None or not args.thread.name.startswith("ray_"):
            previous(args)

    threading.excepthook = hook


def stop_spawned(grace_s: float = 5.0) -> None:
    """Stop every process this process started since ``connect_ray`` began (a local Ray's GCS,
    raylet, workers and agents) that still runs, sweeping again while some are left (at most three
    sweeps): a raylet that dies first (stopped, or killed by a signal to the process group)
    orphans its workers and agents, which this process adopts (``_subreaper``) and the next sweep
    finds. Then this process stops adopting."""
    for _ in range(3):
        spawned = [p for p in descendants() if p.pid not in _Spawned.before]
        if not spawned:
            break
        stop_descendants(spawned, grace_s)
    _subreaper(False)


def _subreaper(on: bool) -> None:
    """Make this process the child subreaper of its descendants, or stop being one (Linux
    ``PR_SET_CHILD_SUBREAPER``; elsewhere nothing): from ``connect_ray`` starting a local Ray to
    ``stop_spawned``, what a dying raylet orphans (its workers, its dashboard and runtime-env
    agents) is adopted here, not by init, so it is still this process's to stop."""
    with contextlib.suppress(Exception):  # not Linux, or no prctl: the first sweep is all there is
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)


_PR_SET_CHILD_SUBREAPER = 36


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
    leaves no process behind (``stop_descendants``, ``stop_spawned``: its dashboard and
    runtime-env agents outlived it by a minute or more). With its GCS gone, ``ray.shutdown``
    would wait on it until Ray's client ends the process (about a minute after the loss), at
    exit too: it is skipped and unregistered; the local Ray's raylet dies with this process."""
    import ray

    if gcs_lost:
        import atexit

        from ftkit import hard_exit

        atexit.unregister(ray.shutdown)
        if own_ray:  # the raylet may be dead already (a signal to the group): its orphans are here
            stop_spawned(grace_s=2.0)
        hard_exit.request()  # Ray's client crashes at interpreter exit without its GCS
        return
    if own_ray:
        spawned = [p for p in descendants() if p.pid not in _Spawned.before]
        ray.shutdown()
        stop_descendants(spawned)
        stop_spawned()  # what the shutdown orphaned


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
