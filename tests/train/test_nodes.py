"""Cells across the nodes of a real Ray cluster, and the loss of a whole node (docs/clusters.md).

Each test builds its own ``ray.cluster_utils.Cluster`` (a GCS and one raylet per node on this
machine, ``clusterkit.node_cluster``; the head has 0 CPUs, so the driver's node never holds a
cell or an engine) and runs ``ftkit train --ray-address`` against it in a subprocess. A node is
lost by ``SIGKILL`` to its raylet process. Every run must exit 0, analyze clean, and be
bitwise equal (``compare-dumps --exact``) to a local fault-free run of the same seed.

Two tests run by default (the spread, and the loss of the node holding one cell and the
engine); the loss of a node holding only an engine, of the only node holding cells, and of
every cell before any checkpoint (a local run: restart from the seed) run with
the full suite (``FTKIT_FULL_TESTS=1``, ``tests/suite.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import clusterkit
import pytest
from faultkit import Trigger, all_events, rank_events

from ftkit.cli import main

pytestmark = pytest.mark.slow

ARGS = ["--cells", "3", "--rollouts", "3", "--steps-per-rollout", "2", "--samples-per-rollout", "24"]
ARGS += ["--micro-shards", "3", "--group-size", "4", "--seed", "23", "--collective-timeout", "5"]
ARGS += ["--step-timeout", "40", "--format", "json"]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("nodes") / "base"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.run(
        [sys.executable, "-m", "ftkit", "train", "--out", str(out), *ARGS],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def driver_events(run_dir: Path, type_: str) -> list[dict]:
    """The driver's events of ``type_`` logged so far (a torn last line is skipped)."""
    path = Path(run_dir) / "events" / "driver-i0.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            ev = json.loads(line)
        except ValueError:
            break
        if ev["type"] == type_:
            out.append(ev)
    return out


def placements(run_dir: Path) -> dict[tuple[str, int, int], list[str]]:
    """(role, cell or engine, rank) -> the nodes it ran on, in order."""
    out: dict[tuple[str, int, int], list[str]] = {}
    for e in driver_events(run_dir, "placement"):
        key = (e["role"], e["cell"] if e["role"] == "trainer" else e["engine"], e.get("rank") or 0)
        out.setdefault(key, []).append(e["node_id"])
    return out


def first_cells(run_dir: Path) -> dict[str, list[int]]:
    """node -> the cells placed there at the start."""
    out: dict[str, list[int]] = {}
    for (role, index, _), nodes in placements(run_dir).items():
        if role == "trainer":
            out.setdefault(nodes[0], []).append(index)
    return out


def check_run(proc: subprocess.CompletedProcess[str], out: Path, baseline: Path) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["verdict"] == "pass"
    assert main(["analyze-events", str(out / "events")]) == 0
    assert main(["compare-dumps", "--exact", str(out), str(baseline)]) == 0


def kill_when(cluster_nodes: list, out: Path, proc: subprocess.Popen, step: int, pick) -> str:
    """Once cell 0 committed ``step``, SIGKILL the raylet of the node ``pick(run_dir)`` names
    (a node id); returns that node id."""
    while not any(e["type"] == "state_fingerprint" and e["step"] >= step for e in rank_events(out, 0)):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    victim = pick(out)
    clusterkit.kill_raylet(next(n for n in cluster_nodes if n.node_id == victim))
    return victim


def finish(proc: subprocess.Popen) -> subprocess.CompletedProcess[str]:
    stdout, stderr = proc.communicate(timeout=600)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.mark.full
def test_cells_and_the_engine_are_spread_over_the_nodes(baseline, tmp_path):
    out = tmp_path / "spread"
    with clusterkit.node_cluster([1, 1, 1]) as (cluster, nodes):  # two slots per node
        check_run(clusterkit.train(cluster.address, out, *ARGS), out, baseline)
        ids = {n.node_id for n in nodes}
    cells = first_cells(out)
    assert sorted(len(c) for c in cells.values()) == [1, 1, 1] and set(cells) == ids
    (engine,) = [nodes for (role, _, _), nodes in placements(out).items() if role == "engine"]
    assert engine[0] in ids
    evs = driver_events(out, "placement")
    assert all(e["planned_node_id"] == e["node_id"] and e["address"] for e in evs)
    doc = json.loads(subprocess.run(
        [sys.executable, "-m", "ftkit", "analyze-events", "--format", "json", str(out / "events")],
        capture_output=True, text=True, check=True,
    ).stdout)  # fmt: skip
    assert doc["stats"]["placement"]["nodes"] == 3


def test_losing_the_node_of_one_cell_and_the_engine_is_survived_and_equal(baseline, tmp_path):
    out = tmp_path / "lose-one"
    with clusterkit.node_cluster([2, 2]) as (cluster, nodes):  # four slots per node: cells 2 + 1
        proc = clusterkit.start_train(cluster.address, out, *ARGS)
        victim = kill_when(nodes, out, proc, 1, lambda run: next(n for n, c in first_cells(run).items() if len(c) == 1))
        result = finish(proc)
    check_run(result, out, baseline)
    (lost,) = first_cells(out)[victim]
    failed = [e for e in all_events(out, "cell_state") if e["new"] == "failed"]
    assert [e["cell"] for e in failed] == [lost] and "lost" in failed[0]["reason"]
    reconfigures = [e for e in all_events(out, "reconfigure") if lost not in e["alive_after"]]
    assert len(reconfigures) == 1  # the survivors went on in one new membership
    survivor_node = next(n for n in first_cells(out) if n != victim)
    where = placements(out)
    assert where[("trainer", lost, 0)] == [victim, survivor_node]  # healed onto the remaining node
    assert where[("engine", 0, 0)] == [victim, survivor_node]  # the engine shared the lost node and moved
    assert [h["cell"] for h in all_events(out, "heal")] == [lost]


@pytest.mark.full
def test_losing_a_node_that_holds_only_the_engine(baseline, tmp_path):
    out = tmp_path / "lose-engine"
    with clusterkit.node_cluster([1, 1, 1, 1]) as (cluster, nodes):  # one cell per node, the engine alone
        proc = clusterkit.start_train(cluster.address, out, *ARGS)
        victim = kill_when(nodes, out, proc, 1, lambda run: placements(run)[("engine", 0, 0)][0])
        result = finish(proc)
    check_run(result, out, baseline)
    assert victim not in first_cells(out)
    assert not [e for e in all_events(out, "cell_state") if e["new"] == "failed"]
    engine = placements(out)[("engine", 0, 0)]
    assert engine[0] == victim and len(engine) == 2 and engine[1] != victim


@pytest.mark.full
def test_losing_the_only_node_with_cells_restarts_them_all_on_a_new_node(baseline, tmp_path):
    out = tmp_path / "lose-all"
    with clusterkit.node_cluster([2]) as (cluster, nodes):
        proc = clusterkit.start_train(cluster.address, out, *ARGS)
        while ("engine", 0, 0) not in placements(out):  # everything placed on the one node
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        cluster.add_node(num_cpus=2)  # a node to start again on, joined after the placement
        victim = kill_when(nodes, out, proc, 1, lambda run: nodes[0].node_id)  # early: an idle machine is fast
        result = finish(proc)
    check_run(result, out, baseline)
    (resumed,) = all_events(out, "run_resumed")
    # from rollout 0's checkpoint when it was published before the loss, else from the seed
    assert (resumed["checkpoint"] is None) == (resumed["checkpoint_step"] == -1) and resumed["checkpoint_step"] <= 1
    where = placements(out)
    assert all(where[("trainer", c, 0)][0] == victim and where[("trainer", c, 0)][-1] != victim for c in range(3))


@pytest.mark.full
def test_losing_every_cell_before_any_checkpoint_restarts_from_the_seed(baseline, tmp_path):
    """A local run of one cell, no checkpoints, whose rank is SIGKILLed after step 0: the cell
    is started again in the same process from the seed's initial state, the run is equal."""
    out = tmp_path / "seed"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    args = [a if a != "3" or i != 1 else "1" for i, a in enumerate(ARGS)] + ["--checkpoint-every", "0"]  # 1 cell
    proc = subprocess.Popen(
        [sys.executable, "-m", "ftkit", "train", "--out", str(out), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    trigger = Trigger(out, cell=0, step=0, action=lambda pid: os.kill(pid, signal.SIGKILL))
    trigger.start()
    result = finish(proc)
    assert trigger.fired is not None
    check_run(result, out, baseline)
    (resumed,) = all_events(out, "run_resumed")
    assert resumed["checkpoint"] is None and resumed["checkpoint_step"] == -1
