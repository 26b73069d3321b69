"""A quick check that something listens at ``--ray-address`` before Ray is asked to join it.

``ray.init(address=...)`` retries for over a minute when nothing listens there. The driver
calls ``probe_ray_address(address, timeout_s)`` first: it resolves the address and opens
(and closes) one TCP connection, all within ``timeout_s``; any failure is a ``ConfigError``
(exit 2) that names the address and the reason. It imports no Ray and sends no data.

Accepted forms (those ``ray.init`` takes for an existing cluster):

- ``HOST:PORT`` or ``[IPV6]:PORT``: the head's GCS address (``ray start --head`` prints it);
- ``ray://HOST:PORT``: a Ray client server;
- ``auto``: the cluster named by ``$RAY_ADDRESS`` or, as Ray does, by the address file
  ``ray_current_cluster`` in Ray's temp directory (``/tmp/ray`` unless ``RAY_TMPDIR`` says);
- ``local``: Ray starts a new local instance; nothing to probe.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

from ftkit.errors import ConfigError

DEFAULT_TIMEOUT_S = 5.0
_HINT = "check the address (ray start --head prints it) and that the head is running, or omit --ray-address"


def probe_ray_address(address: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Return when a TCP connection to ``address`` succeeds within ``timeout_s``; otherwise
    raise ``ConfigError`` saying why (malformed, unresolvable, refused, no answer)."""
    if address.strip() == "local":  # ray.init starts a new local instance: nothing to probe
        return
    target = _resolve_auto() if address.strip() == "auto" else address.strip()
    host, port = split_address(target)
    outcome: list[BaseException | None] = []

    def attempt() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported to the caller below
            outcome.append(exc)

    worker = threading.Thread(target=attempt, name="ftkit-ray-probe", daemon=True)
    worker.start()
    worker.join(timeout_s)  # name resolution has no timeout of its own: bound it here
    if not outcome:
        raise ConfigError(f"--ray-address {address}: no answer from {host}:{port} within {timeout_s:g}s", hint=_HINT)
    exc = outcome[0]
    if exc is None:
        return
    if isinstance(exc, socket.gaierror):
        why = f"cannot resolve host {host!r}"
    elif isinstance(exc, ConnectionRefusedError):
        why = f"nothing listens at {host}:{port} (connection refused)"
    elif isinstance(exc, (TimeoutError, socket.timeout)):
        why = f"no answer from {host}:{port} within {timeout_s:g}s"
    elif isinstance(exc, OSError):
        why = f"cannot connect to {host}:{port}: {exc.strerror or exc}"
    else:
        why = f"cannot connect to {host}:{port}: {type(exc).__name__}"
    raise ConfigError(f"--ray-address {address}: {why}", hint=_HINT)


def split_address(address: str) -> tuple[str, int]:
    """``(host, port)`` of ``HOST:PORT``, ``[IPV6]:PORT`` or ``ray://HOST:PORT``."""
    rest = address
    if "://" in rest:
        scheme, _, rest = rest.partition("://")
        if scheme != "ray":
            raise ConfigError(
                f"--ray-address {address}: unsupported scheme {scheme!r}",
                hint="use HOST:PORT (the head's GCS address) or ray://HOST:PORT (a Ray client server)",
            )
        rest = rest.rstrip("/")
    if rest.startswith("["):
        host, sep, port_text = rest[1:].partition("]:")
    else:
        host, sep, port_text = rest.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(
            f"--ray-address {address}: expected HOST:PORT (e.g. 10.0.0.5:6379) or ray://HOST:PORT", hint=_HINT
        )
    return host, int(port_text)


def _resolve_auto() -> str:
    """The address ``ray.init(address="auto")`` would join, without importing Ray."""
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if env and env != "auto":
        return env
    tmp = Path(os.environ.get("RAY_TMPDIR", "/tmp")) / "ray" / "ray_current_cluster"
    try:
        text = tmp.read_text(encoding="utf-8").strip()
    except OSError:
        text = ""
    if not text:
        raise ConfigError(
            "--ray-address auto: no running Ray cluster found on this machine",
            hint="start one with `ray start --head`, pass its HOST:PORT, or omit --ray-address",
        )
    return text.splitlines()[0]
