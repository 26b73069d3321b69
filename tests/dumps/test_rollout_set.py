"""Which rollouts a run dumps, and the comparison's reading of a rollout on one side only."""

from __future__ import annotations

from ftkit.dumps.compare import _outside_dump_sets
from ftkit.dumps.rollout_set import dumps_rollout


def test_first_last_and_indices_follow_the_final_rollout_count() -> None:
    assert [r for r in range(10) if dumps_rollout("first,last", 10, r)] == [0, 9]
    assert [r for r in range(5) if dumps_rollout(" 1, last ", 5, r)] == [1, 4]
    assert not any(dumps_rollout("none", 3, r) for r in range(3))
    assert all(dumps_rollout("ALL", 3, r) for r in range(3))


def test_a_leftover_dump_is_excused_only_when_neither_final_config_asks_for_it() -> None:
    extended = {"dump_rollouts": "first,last", "rollouts": 10}
    assert _outside_dump_sets(4, extended, dict(extended))  # the first session's last rollout
    assert not _outside_dump_sets(9, extended, dict(extended))  # the final last: CD006 when missing
    assert not _outside_dump_sets(4, extended, {"dump_rollouts": "4", "rollouts": 10})  # B asks for it
    assert not _outside_dump_sets(4, extended, None)  # a dump tree without run.json: fail closed
    assert not _outside_dump_sets(4, extended, {"dump_rollouts": 3, "rollouts": 10})  # unreadable
    assert not _outside_dump_sets(4, extended, {"dump_rollouts": "first,x", "rollouts": 10})
