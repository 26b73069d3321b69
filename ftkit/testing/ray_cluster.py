"""A real multi-node Ray cluster on this machine, for tests, benchmarks and trying node loss by hand.

``node_cluster(cpus)`` starts a ``ray.cluster_utils.Cluster`` (its own GCS and one raylet per
node, in a temp dir of its own under /tmp): a head with 0 CPUs (a driver connects to it; no
cell or engine lands there, so killing a worker node never kills the driver's node) and one
worker node per entry of ``cpus``. It yields ``(cluster, nodes)`` (``cluster.address`` is what
``--ray-address`` takes; ``cluster.add_node(num_cpus=...)`` joins one more) and shuts the
cluster down at the end. GCS health checks run every 500 ms with a threshold of 3, so a killed
raylet is declared dead in about 2 s (Ray's defaults: 3 s x 5).

``raylet_pid(node)`` is the pid of a node's raylet process; ``kill_raylet(node)`` sends it
``SIGKILL``: the node is lost as a whole (its workers exit once their raylet is gone).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from typing import Any

#: GCS health checks of these clusters (a lost node is declared dead within ~2 s).
HEALTH = {"health_check_period_ms": 500, "health_check_failure_threshold": 3, "health_check_initial_delay_ms": 0}


@contextlib.contextmanager
def node_cluster(cpus: list[float]) -> Iterator[tuple[Any, list[Any]]]:
    """See the module docstring."""
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
        shutil.rmtree(temp_dir, ignore_errors=True)


def raylet_pid(node: Any) -> int:
    """The pid of ``node``'s raylet process."""
    from ray._private import ray_constants

    pid: int = node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
    return pid


def kill_raylet(node: Any) -> int:
    """``SIGKILL`` ``node``'s raylet; returns its pid."""
    pid = raylet_pid(node)
    os.kill(pid, signal.SIGKILL)
    return pid
