"""Seconds per rule, for the JUnit report's ``time`` of each rule's test case.

``clock_rules(rules, seconds)`` replaces each rule's hooks (``on_event``, ``outcome``,
``on_step``, ``on_rollout``, ``finish``) on the instance by a wrapper that adds the
``time.perf_counter`` seconds of each call to ``seconds[rule.code]``. A rule's time is therefore
the time spent in its own code, not the replay's shared work (reading, validation, the core
handlers, the watermark). The replay calls it only when asked (``Replay(timed=True)``: the
command writes ``--junit-xml``), so the hot loop pays nothing otherwise; it must run before the
replay collects the hooks into its dispatch tables. The worker-process path
(``ftkit.analysis.parallel``) runs the rules in this process too, so its times have the same
shape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from time import perf_counter
from typing import Any

HOOKS = ("on_event", "outcome", "on_step", "on_rollout", "finish")


def clock_rules(rules: Iterable[Any], seconds: dict[str, float]) -> None:
    """Time every hook of every rule in ``rules`` into ``seconds`` (by code, starting at 0.0)."""
    for rule in rules:
        seconds[rule.code] = 0.0
        for name in HOOKS:
            hook = getattr(rule, name, None)
            if hook is not None:
                setattr(rule, name, _clocked(hook, rule.code, seconds))


def _clocked(hook: Callable[..., None], code: str, seconds: dict[str, float]) -> Callable[..., None]:
    def clocked(*args: Any) -> None:
        t0 = perf_counter()
        try:
            hook(*args)
        finally:
            seconds[code] += perf_counter() - t0

    return clocked
