"""Exactly-once sample accounting (invariant I2): FT103 missing, FT104 duplicate, FT105 unknown.

Counts come from committed step attempts only, once per (rollout, step, attempt) whichever cell
reported them; a rollout is judged when it is closed (every source has moved past it).
"""

from __future__ import annotations

from ftkit.analysis.records import RolloutRecord
from ftkit.analysis.registry import Rule, register

MAX_IDS = 20


def _sample(items: list[tuple[int, int, int]]) -> list[dict[str, int]]:
    return [{"id": i, "counted": got, "expected": exp} for i, got, exp in items[:MAX_IDS]]


def _named(items: list[tuple[int, int, int]], shown: int = 5) -> str:
    """``ids 17 (counted 0 of 1), 40 (counted 2 of 1), ...``: the first ``shown`` of ``items``."""
    text = ", ".join(f"{i} (counted {got} of {exp})" for i, got, exp in items[:shown])
    return f"ids {text}" + (f" and {len(items) - shown} more" if len(items) > shown else "")


def _steps(ro: RolloutRecord) -> str:
    return f"over its {ro.committed_steps} committed step(s)"


def _for_producer(rule: Rule, train: str, evidence: str) -> str:
    """``evidence`` for a log written through the evidence API (its ``evidence_profile`` was
    taken), ``train`` for ``ftkit train``'s: a hint speaks of what its reader controls."""
    return evidence if rule.replay.profile is not None else train


@register
class WitnessMissing(Rule):
    code = "FT103"
    name = "witness-missing"
    description = "an allocated witness id was counted fewer than `expected` times over the rollout's committed steps"
    fix = (
        "samples were lost: a committed step did not train every sample it was given (with ftkit train: "
        "the micro-shards redistributed after a reconfigure, or a discarded step's retry; with the evidence "
        "API: a rank's data loader skipped or dropped samples, e.g. drop_last or a sampler not set to the epoch)"
    )

    def hint(self) -> str:
        return _for_producer(
            self,
            "samples were lost: a committed step did not train every sample it was given (the micro-shards "
            "redistributed after a reconfigure, or a discarded step's retry)",
            "samples were lost: a rank's data loader skipped or dropped samples of the rollout (drop_last, a "
            "sampler not set to the epoch, a filtered batch), or step(samples=) left out ids the rank trained; "
            "every id given to allocate() must reach step(samples=) as often as expected",
        )

    def on_rollout(self, ro: RolloutRecord) -> None:
        if ro.ids is None:
            return
        expected = ro.expected_counts()
        self.check(len(expected))
        short = [(i, ro.tally.get(i, 0), n) for i, n in expected.items() if ro.tally.get(i, 0) < n]
        if short:
            self.report(
                f"rollout {ro.rollout}: {len(short)} of {len(expected)} samples counted fewer times than "
                f"expected {_steps(ro)}: {_named(short)}",
                rollout=ro.rollout,
                samples=len(short),
                ids=_sample(short),
                where=ro.where,
            )


@register
class WitnessDuplicate(Rule):
    code = "FT104"
    name = "witness-duplicate"
    description = "an allocated witness id was counted more than `expected` times (trained twice)"
    fix = (
        "samples were trained twice: with ftkit train, a discarded attempt leaked into a commit or micro-shards "
        "overlap; with the evidence API, two ranks were given the same samples (a sampler without the rank or "
        "world size) or a step was repeated after a restart without the rollout being allocated again"
    )

    def hint(self) -> str:
        return _for_producer(
            self,
            "samples were trained twice: a discarded attempt leaked into a commit, or micro-shards overlap",
            "samples were trained twice: two ranks were given the same samples (a sampler without the rank or "
            "world size), a batch was trained again, or a step was repeated after a restart without the "
            "rollout being allocated again",
        )

    def on_rollout(self, ro: RolloutRecord) -> None:
        if ro.ids is None:
            return
        expected = ro.expected_counts()
        self.check(len(expected))
        extra = [(i, ro.tally[i], n) for i, n in expected.items() if ro.tally.get(i, 0) > n]
        if extra:
            self.report(
                f"rollout {ro.rollout}: {len(extra)} of {len(expected)} samples counted more times than expected "
                f"{_steps(ro)}: {_named(extra)}",
                rollout=ro.rollout,
                samples=len(extra),
                ids=_sample(extra),
                where=ro.where,
            )


@register
class WitnessUnknown(Rule):
    code = "FT105"
    name = "witness-unknown"
    description = "a witness id was counted that was not allocated to that rollout"
    fix = "data from another rollout (or a stale batch) reached the model"

    def on_rollout(self, ro: RolloutRecord) -> None:
        if ro.ids is None:
            return
        allocated = set(ro.ids)
        self.check(len(ro.tally))
        unknown = [(i, n, 0) for i, n in ro.tally.items() if i not in allocated]
        if unknown:
            self.report(
                f"rollout {ro.rollout}: {len(unknown)} counted witness ids were never allocated to it: "
                + ", ".join(str(i) for i, _, _ in unknown[:5])
                + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""),
                rollout=ro.rollout,
                samples=len(unknown),
                ids=_sample(unknown),
                where=ro.where,
            )
