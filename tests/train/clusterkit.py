"""Test helpers for multi-node runs: a real Ray cluster on this machine and node kills.

``node_cluster(cpus)`` starts a ``ray.cluster_utils.Cluster`` (its own GCS and one raylet per
node, in a temp dir of its own): a head with 0 CPUs (the driver connects to it; no cell or
engine lands there, so killing a worker node never kills the driver's node) and one worker
node per entry of ``cpus``. It yields ``(cluster, nodes)`` and shuts the cluster down at the
end. Health checks run every 500 ms with a threshold of 3 so a killed raylet is declared dead
in ~2 s (Ray's defaults: 3 s x 5).

``raylet_pid(node)`` is the pid of a node's raylet process; ``kill_raylet(node)``
``SIGKILL``s it: the node is lost as a whole (its workers exit once their raylet is gone).
``train(address, out, *args)`` runs ``ftkit train --ray-address address`` in a subprocess.

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
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: GCS health checks of the test clusters (period ms, failures before a node is dead).
HEALTH = {"health_check_period_ms": 500, "health_check_failure_threshold": 3, "health_check_initial_delay_ms": 0}


@contextlib.contextmanager
def node_cluster(cpus: list[float]) -> Iterator[tuple[Any, list[Any]]]:
    from ray.cluster_utils import Cluster

    temp_dir = tempfile.mkdtemp(prefix="ftn", dir="/tmp")  # short: Ray's socket paths must fit
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "include_dashboard": False, "temp_dir": temp_dir, "_system_config": HEALTH},
    )
    try:
        nodes = [cluster.add_node(num_cpus=n) for n in cpus]
        cluster.wait_for_nodes()
        yield cluster, nodes
    finally:
        cluster.shutdown()


def raylet_pid(node: Any) -> int:
    from ray._private import ray_constants

    pid: int = node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
    return pid


def kill_raylet(node: Any) -> int:
    pid = raylet_pid(node)
    os.kill(pid, signal.SIGKILL)
    return pid


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
