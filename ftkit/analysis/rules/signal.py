"""Whether training had anything to learn from: FT116 a rollout without learning signal.

GRPO and ftkit's REINFORCE take group-normalised advantages: a group whose rewards are all
equal has zero advantages, and a rollout in which every group does trains on nothing (loss and
gradient exactly 0), silently, however long it runs: a reward that never varies (a constant, a
plug-in that always fails its parse), or a task too easy or too hard for the policy. ``ftkit
train`` logs the share of such groups in each rollout's ``metric`` (``zero_advantage_groups``,
``ftkit.train.rl.rollout_stats``); a rollout at 1.0 is a warning: the run may be correct, but
that rollout taught the model nothing.
"""

from __future__ import annotations

from typing import Any

from ftkit.analysis.registry import Rule, register
from ftkit.findings import Severity

_SHARE = "zero_advantage_groups"


@register
class NoLearningSignal(Rule):
    code = "FT116"
    name = "no-learning-signal"
    severity = Severity.warning
    description = (
        "a rollout in which every group's advantages are 0 (metric zero_advantage_groups = 1: each group's "
        "rewards are all equal), so it trained nothing: loss and gradient 0"
    )
    fix = (
        "check that the reward varies (a constant reward, a parse that always fails), or use larger groups, "
        "a higher temperature or prompts the policy sometimes solves"
    )
    events = ("metric",)

    def on_event(self, ev: dict[str, Any], fi: int, line: int) -> None:
        share = ev["values"].get(_SHARE)
        if share is None:
            return
        self.check()
        if share == 1.0:
            reward = ev["values"].get("reward")
            self.report(
                f"rollout {ev['rollout']} learns nothing: every group's advantages are 0 "
                f"(the rewards within each group are all equal, mean reward {reward})",
                rollout=ev["rollout"],
                where=self.replay.where(fi, line),
            )
