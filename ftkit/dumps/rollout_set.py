"""Which rollouts a run dumps: the one reading of ``--dump-rollouts`` that training and the
comparison share.

``dumps_rollout(spec, rollouts, rollout)``: whether ``rollout`` (0-based) of a run of
``rollouts`` rollouts is dumped under ``spec`` (``none``, ``all``, or a comma list of ``first``,
``last`` and indices; ``last`` is the final config's last rollout). A run extended by
``--resume --rollouts N`` keeps the dump of its earlier session's last rollout, which its final
config no longer asks for: ``ftkit compare-dumps`` uses this to tell such a dump (CD013) from a
missing one (CD006).
"""

from __future__ import annotations


def dumps_rollout(spec: str, rollouts: int, rollout: int) -> bool:
    spec = spec.strip().lower()
    if spec == "none":
        return False
    if spec == "all":
        return True
    last = rollouts - 1
    wanted = {0 if p.strip() == "first" else last if p.strip() == "last" else int(p) for p in spec.split(",")}
    return rollout in wanted
