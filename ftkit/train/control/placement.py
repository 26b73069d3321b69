"""Placement of cells and engines over the nodes of a Ray cluster, and where they landed.

A node's *slots* are the rank actors its total Ray resources hold (a rank's resources: the
run's ``Placement``, ``ftkit.train.plan.placement``; an engine counts as one slot).
``spread`` plans which node each cell and engine asks for:

* a cell goes to the node with the fewest planned cells among those with free slots for all
  of its ranks (ties: more free slots first, then Ray's node order). With ``N`` nodes able to
  hold a cell, no node gets more than ``ceil(cells / N)`` cells whenever the free slots allow
  it, so one node's loss leaves survivors as soon as ``N >= 2``;
* then each engine goes to the node with the fewest engines, then the fewest cells, among
  those with a free slot;
* a cell no node has room for gets no target (its group is ``PACK``: Ray puts its ranks
  where they fit, over several nodes if it must); the plan then carries a warning, as it does
  when fewer than two nodes of a multi-node cluster can hold a cell. A cluster too small for
  the spread still runs.

The plan is a preference, not a constraint: a cell's placement group is ``STRICT_PACK`` with
Ray's ``_soft_target_node_id`` (its ranks stay on one node; the target is used when it has
room and falls back to any node that has when it is full or gone), an engine is scheduled
with a soft ``NodeAffinitySchedulingStrategy``. Other jobs' use of a shared cluster is not
subtracted from the slots: Ray's fallback absorbs it.

``Placer`` keeps the nodes each cell and engine actually runs on (from the placement-group
table and the engine's own node id), logs one ``placement`` event per rank and engine, and
plans restarts (``cell_target`` / ``engine_target``) on live nodes, preferring nodes without
a live cell (engine: without an engine). ``dead_nodes`` says which recorded nodes Ray no
longer lists as alive (the coordinator fails every cell on them at once).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import ftkit.evidence.emit as emit

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup

    from ftkit.events.writer import EventWriter


@dataclass(frozen=True)
class Node:
    """A live Ray node that can hold at least one actor."""

    node_id: str
    address: str
    slots: int


@dataclass
class Plan:
    """Target node per cell and per engine (``None``: no preference) and the warnings."""

    cells: dict[int, str | None] = field(default_factory=dict)
    engines: dict[int, str | None] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def live_nodes(each: dict[str, float]) -> list[Node]:
    """The alive nodes of the connected cluster, in Ray's order; a node's slots are the actors
    of resources ``each`` it holds (a head without resources has no slot)."""
    import ray

    out = []
    for n in ray.nodes():
        res = n.get("Resources") or {}
        slots = min(int(float(res.get(k, 0.0)) / v + 1e-9) for k, v in each.items())
        if n.get("Alive"):
            out.append(Node(n["NodeID"], n["NodeManagerAddress"], slots))
    return out


def spread(
    nodes: list[Node],
    cells: list[int],
    ranks: int,
    engines: list[int],
    used: dict[str, int] | None = None,
    cell_load: dict[str, int] | None = None,
    engine_load: dict[str, int] | None = None,
) -> Plan:
    """Plan ``cells`` (of ``ranks`` ranks each) and ``engines`` over ``nodes`` (see the module
    docstring). ``used``: slots already taken per node; ``cell_load`` / ``engine_load``: live
    cells / engines already on each node (a restart)."""
    free = {n.node_id: n.slots - (used or {}).get(n.node_id, 0) for n in nodes}
    cload = {n.node_id: (cell_load or {}).get(n.node_id, 0) for n in nodes}
    eload = {n.node_id: (engine_load or {}).get(n.node_id, 0) for n in nodes}
    order = {n.node_id: i for i, n in enumerate(nodes)}
    plan = Plan()
    for c in cells:
        fits = [n for n in free if free[n] >= ranks]
        target = min(fits, key=lambda n: (cload[n], -free[n], order[n])) if fits else None
        plan.cells[c] = target
        if target is None:
            plan.warnings.append(f"no node has {ranks} free slot(s) for cell {c}: Ray places its ranks where they fit")
            continue
        free[target] -= ranks
        cload[target] += 1
    for e in engines:
        fits = [n for n in free if free[n] >= 1]
        target = min(fits, key=lambda n: (eload[n], cload[n], -free[n], order[n])) if fits else None
        plan.engines[e] = target
        if target is not None:
            free[target] -= 1
            eload[target] += 1
    able = sum(1 for n in nodes if n.slots >= ranks)
    if cells and able < 2 and len(nodes) > 1 and used is None:  # a one-node instance: no spread to miss
        plan.warnings.append(
            f"{able} node(s) can hold a cell of {ranks} rank(s): losing that node loses every cell "
            "(join more nodes for the spread)"
        )
    return plan


class Placer:
    """Where the run's cells and engines are (see the module docstring)."""

    def __init__(self, resources: dict[str, float], ranks: int, events: EventWriter) -> None:
        """``resources``: one rank actor's (``Placement.rank_resources``); ``ranks``: per cell."""
        self.resources, self.ranks, self.events = resources, ranks, events
        self.cell_nodes: dict[int, list[str]] = {}  # cell -> node per rank (current incarnation)
        self.engine_nodes: dict[int, str] = {}
        self.planned: dict[tuple[str, int], str | None] = {}  # (role, index) -> target asked for
        self.addresses: dict[str, str] = {}

    def plan_start(self, cells: int, engines: int) -> Plan:
        """The plan of a run's start; its warnings go to stderr."""
        plan = spread(self._nodes(), list(range(cells)), self.ranks, list(range(engines)))
        for w in plan.warnings:
            sys.stderr.write(f"warning: placement: {w}\n")
        self.planned.update({("trainer", c): t for c, t in plan.cells.items()})
        self.planned.update({("engine", e): t for e, t in plan.engines.items()})
        return plan

    def _nodes(self) -> list[Node]:
        """``live_nodes``, remembering each node's address for the ``placement`` events."""
        nodes = live_nodes(self.resources)
        self.addresses.update({n.node_id: n.address for n in nodes})
        return nodes

    def _loads(self, skip_cell: int | None = None, skip_engine: int | None = None) -> tuple[dict[str, int], ...]:
        used: dict[str, int] = {}
        cload: dict[str, int] = {}
        eload: dict[str, int] = {}
        for c, ns in self.cell_nodes.items():
            if c != skip_cell:
                for n in ns:
                    used[n] = used.get(n, 0) + 1
                for n in set(ns):
                    cload[n] = cload.get(n, 0) + 1
        for e, n in self.engine_nodes.items():
            if e != skip_engine:
                used[n] = used.get(n, 0) + 1
                eload[n] = eload.get(n, 0) + 1
        return used, cload, eload

    def plan_cells(self, cells: int) -> dict[int, str | None]:
        """Targets for all ``cells`` started again at once (every live cell was lost), on the
        live nodes, around the engines."""
        self.cell_nodes.clear()
        used, cload, eload = self._loads()
        plan = spread(self._nodes(), list(range(cells)), self.ranks, [], used, cload, eload)
        for w in plan.warnings:
            sys.stderr.write(f"warning: placement: {w}\n")
        self.planned.update({("trainer", c): t for c, t in plan.cells.items()})
        return plan.cells

    def cell_target(self, cell: int) -> str | None:
        """The node a restarted ``cell`` asks for: a live one, fewest live cells first."""
        self.cell_nodes.pop(cell, None)
        used, cload, eload = self._loads()
        target = spread(self._nodes(), [cell], self.ranks, [], used, cload, eload).cells[cell]
        self.planned[("trainer", cell)] = target
        return target

    def engine_target(self, engine: int) -> str | None:
        """The node a restarted ``engine`` asks for: a live one, fewest engines first."""
        self.engine_nodes.pop(engine, None)
        used, cload, eload = self._loads()
        target = spread(self._nodes(), [], self.ranks, [engine], used, cload, eload).engines[engine]
        self.planned[("engine", engine)] = target
        return target

    def placed_cell(self, cell: int, incarnation: int, placement_group: PlacementGroup | None) -> None:
        """Record and log where a placed cell's ranks run (one ``placement`` per rank)."""
        from ray.util.placement_group import placement_group_table

        table = placement_group_table(placement_group).get("bundles_to_node_id") or {}
        nodes = [str(table.get(r, "")) for r in range(len(table))]
        self.cell_nodes[cell] = nodes
        for rank, node in enumerate(nodes):
            self._emit("trainer", node, incarnation, cell=cell, rank=rank)

    def placed_engine(self, engine: int, restarts: int, node: str) -> None:
        """Record and log where an engine runs."""
        self.engine_nodes[engine] = node
        self._emit("engine", node, restarts, engine=engine)

    def _emit(self, role: Literal["trainer", "engine"], node: str, incarnation: int, **where: int) -> None:
        index = where.get("cell", where.get("engine", 0))
        emit.placement(
            self.events,
            role=role,
            incarnation=incarnation,
            node_id=node,
            address=self.address(node),
            planned_node_id=self.planned.get((role, index)),
            **where,
        )

    def address(self, node: str) -> str:
        """The address of ``node`` (``""`` when Ray does not know it)."""
        if node not in self.addresses:
            import ray

            self.addresses.update({n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()})
        return self.addresses.get(node, "")

    def dead_nodes(self) -> set[str]:
        """Nodes holding a recorded cell or engine that Ray no longer lists as alive."""
        import ray

        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        held = {n for ns in self.cell_nodes.values() for n in ns} | set(self.engine_nodes.values())
        return held - alive

    def cells_on(self, nodes: set[str]) -> list[int]:
        """The recorded cells with a rank on any of ``nodes``, sorted."""
        return sorted(c for c, ns in self.cell_nodes.items() if nodes & set(ns))
