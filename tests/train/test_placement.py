"""``ftkit.train.control.placement.spread``: the plan of cells and engines over nodes (no Ray)."""

import math

from hypothesis import given
from hypothesis import strategies as st

from ftkit.train.control.placement import Node, spread


def nodes(*slots: int) -> list[Node]:
    return [Node(f"n{i}", f"10.0.0.{i}", s) for i, s in enumerate(slots)]


def per_node(targets: dict[int, str | None]) -> dict[str | None, int]:
    out: dict[str | None, int] = {}
    for t in targets.values():
        out[t] = out.get(t, 0) + 1
    return out


def test_three_cells_on_two_nodes_are_split_two_one_and_engines_spread():
    plan = spread(nodes(4, 8), [0, 1, 2], ranks=1, engines=[0, 1])
    assert sorted(per_node(plan.cells).values()) == [1, 2]
    assert sorted(per_node(plan.engines).values()) == [1, 1]
    assert not plan.warnings


def test_a_cell_stays_on_one_node_and_nodes_too_small_for_it_hold_none():
    plan = spread(nodes(1, 2, 2), [0, 1], ranks=2, engines=[0])
    assert set(plan.cells.values()) == {"n1", "n2"}
    assert plan.engines[0] == "n0"  # the only free slot left


def test_a_cluster_too_small_for_the_spread_still_plans_with_warnings():
    plan = spread(nodes(0, 3), [0, 1, 2], ranks=1, engines=[0])  # a head without CPUs and one worker
    assert set(plan.cells.values()) == {"n1"} and plan.engines[0] is None
    assert any("losing that node loses every cell" in w for w in plan.warnings)
    assert not spread(nodes(3), [0, 1, 2], ranks=1, engines=[]).warnings  # one machine: nothing to spread
    plan = spread(nodes(1, 1), [0], ranks=2, engines=[])
    assert plan.cells == {0: None} and any("no node has 2 free slot" in w for w in plan.warnings)


def test_a_restart_prefers_a_live_node_without_a_live_cell():
    plan = spread(nodes(8, 8, 8), [2], 1, [], used={"n0": 2, "n1": 1}, cell_load={"n0": 1, "n1": 1})
    assert plan.cells == {2: "n2"} and not plan.warnings


@given(
    st.lists(st.integers(min_value=0, max_value=12), min_size=1, max_size=6),
    st.integers(min_value=1, max_value=9),
    st.integers(min_value=1, max_value=3),
)
def test_no_node_holds_more_than_its_share_when_the_slots_allow(slots, cells, ranks):
    ns = nodes(*slots)
    able = [n for n in ns if n.slots >= ranks]
    plan = spread(ns, list(range(cells)), ranks, [])
    if not able or sum(n.slots // ranks for n in able) < cells:
        return  # not enough room: what fits is placed, the rest has no target
    share = math.ceil(cells / len(able))
    if all(n.slots // ranks >= share for n in able):  # every node can take its share
        assert max(per_node(plan.cells).values()) <= share
    used: dict[str | None, int] = per_node(plan.cells)
    assert all(used.get(n.node_id, 0) * ranks <= n.slots for n in ns)
