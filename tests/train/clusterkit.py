"""Test helpers for multi-node runs: a real Ray cluster on this machine, node kills, Ray heads.

``node_cluster``, ``raylet_pid`` and ``kill_raylet`` are ``ftkit.testing.ray_cluster``'s (a
Cluster whose head has 0 CPUs, so the driver's node is never lost; health checks that declare
a killed raylet's node dead in ~2 s).

``train(address, out, *args)`` runs ``ftkit train --ray-address address`` in a subprocess
(``start_train``: without waiting).

``ray_head(env, log_path, temp_dir)`` runs ``ray start --head --block`` on loopback and a free
port in a subprocess of its own process group (``env``: its environment; ``temp_dir``: its
``--temp-dir``, or ``None`` for Ray's default under ``$TMPDIR``), yields its address once it
is up and stops it in the end by signalling that process group only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from ftkit.testing.ray_cluster import kill_raylet, node_cluster, raylet_pid

__all__ = ["free_port", "kill_raylet", "node_cluster", "ray_head", "raylet_pid", "start_train", "train"]


def train(address: str, out: Path, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    return subprocess.run(
        [sys.executable, "-m", "ftkit", "train", "--ray-address", address, "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
    )


def start_train(address: str, out: Path, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    return subprocess.Popen(
        [sys.executable, "-m", "ftkit", "train", "--ray-address", address, "--out", str(out), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def ray_head(env: dict[str, str], log_path: str, temp_dir: str | None = None, cpus: int = 4) -> Iterator[str]:
    port = free_port()
    env = {**env, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}  # SIGTERM stops the head at once, no drain
    args = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--port={port}"]
    args += ["--node-ip-address=127.0.0.1", f"--num-cpus={cpus}", "--include-dashboard=false", "--disable-usage-stats"]
    args += [f"--temp-dir={temp_dir}"] if temp_dir else []
    with open(log_path, "w+") as log:
        head = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            deadline = time.monotonic() + 120
            while "Ray runtime started" not in Path(log_path).read_text():
                assert head.poll() is None, Path(log_path).read_text()
                assert time.monotonic() < deadline, "the Ray head did not start in 120 s"
                time.sleep(0.5)
            yield f"127.0.0.1:{port}"
        finally:
            try:
                os.killpg(head.pid, signal.SIGTERM)  # the head and the processes it spawned
                head.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(head.pid, signal.SIGKILL)
                head.wait()
            except ProcessLookupError:
                pass
