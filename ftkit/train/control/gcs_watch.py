"""``GcsWatch``: whether the Ray GCS the driver is connected to still answers (see the class)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


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

    def gone(self) -> bool:
        """At the end of a run: whether the GCS is ``lost``, or, once a signal arrived, does not
        answer a probe now (a signal to the process group stops a local Ray's GCS too)."""
        from ftkit.train.control.run_end import pending_interruption

        return self.lost() is not None or (pending_interruption() is not None and not self.answers())

    def answers(self, timeout_s: float = 2.0) -> bool:
        """Whether the GCS answers one probe now, within ``timeout_s``: at the end of a run a
        signal interrupted, the GCS may have had the same signal (sent to the process group:
        Ctrl-C, ``timeout``, ``kill -- -PGID``), and a shutdown that waits on a dead GCS is ended by
        Ray's client a minute later with nothing recorded. True where Ray lacks the probe call."""
        import ray

        probe = self._probe()
        if probe is None:  # pragma: no cover - a Ray without this client API
            return True
        try:
            probe(b"ftkit-gcs-probe", None, timeout=timeout_s)
        except ray.exceptions.RpcError:
            return False
        except Exception:  # noqa: BLE001 - the probe itself broke: assume nothing
            return True
        return True

    @staticmethod
    def _probe() -> Callable[..., Any] | None:
        import ray

        try:
            return ray._private.worker.global_worker.gcs_client.internal_kv_get  # type: ignore[attr-defined]
        except AttributeError:  # pragma: no cover - a Ray without this client API
            return None

    def check(self) -> None:
        """``RunFailed`` once the GCS is ``lost``: without it no actor can be restarted or
        released, and Ray's client would end this process a minute after the loss with nothing
        logged; the run ends here instead, its log and status complete."""
        lost = self.lost()
        if lost is not None:
            from ftkit.train.control.run_end import RunFailed

            raise RunFailed(
                f"Ray's GCS (the cluster's control plane) has not answered for {lost:.0f}s: the run "
                "cannot restart or release its actors without it",
                hint="restart Ray (or the cluster's head), then continue with `ftkit train --resume RUN_DIR`",
            )

    def _watch(self) -> None:
        import time

        import ray

        probe = self._probe()
        if probe is None:  # pragma: no cover - a Ray without this client API
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
