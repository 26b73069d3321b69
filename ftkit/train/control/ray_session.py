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
from collections.abc import Callable
from typing import Any

from ftkit.errors import ConfigError
from ftkit.train.config import STARTUP_TIMEOUT_S, TrainConfig

#: Logical CPUs of the local Ray instance (more than the cores: actors ask for fractions).
LOCAL_RAY_CPUS = 8


def connect_ray(cfg: TrainConfig, rearm: Callable[[], None] = lambda: None) -> bool:
    """Make sure Ray is initialised; returns whether this call did it (and must shut it down).

    ``ray.init`` installs its own SIGTERM handler (``sys.exit(15)``); ``rearm`` is called right
    after it to put the caller's back, and a SIGTERM that lands while Ray starts is the
    caller's ``RunInterrupted`` (exit 143), not Ray's bare exit status 15: the half-started Ray
    is shut down first."""
    import ray

    if ray.is_initialized():
        return False
    if cfg.cluster.ray_address:  # a dead address is exit 2 within seconds, not a minute of retries
        from ftkit.train.control.ray_probe import probe_ray_address

        probe_ray_address(cfg.cluster.ray_address, timeout_s=5.0)
    quiet: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}  # stderr is for ftkit's progress
    try:
        if cfg.cluster.ray_address:
            ray.init(address=cfg.cluster.ray_address, **quiet)
        else:
            ray.init(address="local", num_cpus=LOCAL_RAY_CPUS, include_dashboard=False, **quiet)
        rearm()
    except SystemExit as exc:
        if exc.code != signal.SIGTERM:
            raise
        from ftkit.train.control.run_end import RunInterrupted

        with contextlib.suppress(Exception):
            ray.shutdown()
        raise RunInterrupted(signal.SIGTERM, started=False) from None
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


def disconnect(own_ray: bool, gcs_lost: bool = False) -> None:
    """Shut Ray down if this run started (or joined) it. With its GCS gone, ``ray.shutdown``
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
        ray.shutdown()


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
