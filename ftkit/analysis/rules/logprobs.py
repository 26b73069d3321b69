"""Did the engines sample from the policy the trainer trained? FT114 engine-vs-trainer log-probs.

With ``--loss grpo`` every rank recomputes, at each rollout's first step (its weights are the
version the engines sampled with), the policy's log-probs of the response tokens of its
micro-shards of every step of the rollout and logs them against the engines' recorded ones
(``logprob_check``): together the cells compare every sample of the rollout. ftkit's megatron engine
and a TP=1 trainer run the same model with the same kernels on the same float32 logits, so
their log-probs are bitwise equal: any differing token is an error. With TP > 1 the trainer's
row-parallel sums round differently from the engine's TP=1 model, and a vLLM engine
(``engine_kind: vllm``) computes with its own kernels, so there a difference up to the run's
``logprob_tolerance`` (``TOLERANCE`` where the config does not say) is expected and only a larger
one is reported (a warning).

The finding names the likely cause from evidence the log already holds: *stale weights*
(an engine's fingerprint of that version is the previous version's), *wrong weights* (an
engine's fingerprint is neither what was sent nor the previous version: see FT102), or
*arithmetic* (every engine holds exactly the weights sent and the trainer scored the recorded
tokens, yet the log-probs differ); and where in the responses the differing tokens are.

Canaries (every ``ftkit train`` run at ``pp=1``, REINFORCE too): each engine scores a fixed
canary set after it loads a version and each cell's trainer scores it at the first step of the
rollout that version generated (``canary_logprobs``); per version every engine's scores must
equal the trainer's, under the same tolerance, with the same causes named. A stale engine is
caught even when the rollout's own batch would not show it.

Fail closed: in a run whose config says ``loss: grpo``, a committed first step of a rollout
whose samples (all of the rollout's) were not all compared is an error (missing evidence); in an ``ftkit train`` run
at ``pp=1`` (its config has ``loss`` and it logs no ``evidence_profile``) with engines, a
committed first step of a rollout without a trainer's and an engine's canary scores of its
version is one too. Another producer's log (an ``evidence_profile``) owes neither: the rule
compares what is there and otherwise reports it ran on nothing.

Memory: per weights version its sent and loaded fingerprints (two short strings per engine),
per checked step the set of compared sample ids, and the findings' worst entries.
"""

from __future__ import annotations

import math
from typing import Any

from ftkit.analysis.records import StepRecord
from ftkit.analysis.registry import Rule, register
from ftkit.findings import Severity

#: Largest |engine - trainer| tolerated where they are not bitwise equal by construction (TP > 1,
#: a vLLM engine) and the config names no ``logprob_tolerance``.
TOLERANCE = 1e-3
MAX_POSITIONS = 8


def _delta(a: Any, b: Any) -> float:
    """``|a - b|`` of two logged log-probs; infinite where either is not a finite number."""
    ok = all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in (a, b))
    return abs(a - b) if ok else math.inf


@register
class LogprobMismatch(Rule):
    code = "FT114"
    name = "logprob-mismatch"
    description = (
        "the trainer's recomputed log-probs of a rollout's tokens, or of the canary set, differ from the "
        f"engines' (any bit with megatron engines at TP=1; more than the tolerance, {TOLERANCE:g} by default, "
        "at TP > 1 or with vLLM engines), or a rollout's first step lacks "
        "the comparison"
    )
    fix = (
        "the engines did not sample from the policy that was trained: check the named cause "
        "(stale or wrong engine weights: the weight sync; arithmetic: the engine's and trainer's kernels and dtypes)"
    )
    events = ("logprob_check", "canary_logprobs", "weights_sent", "engine_weights", "run_started", "run_resumed")

    def __init__(self, replay: Any) -> None:
        super().__init__(replay)
        self.grpo = False
        self.canaries = False  # an ftkit train log at pp=1 with engines: canary scores are due
        self.exact = True  # megatron engines and a TP=1 trainer: bitwise equal by construction
        self.tolerance = TOLERANCE
        self.step_samples = 0
        self.steps_per_rollout = 1
        self.sent: dict[int, str] = {}
        self.loaded: dict[int, dict[int, str]] = {}
        self.compared: dict[int, set[int]] = {}  # step -> compared sample ids
        self.first_steps: dict[int, tuple[int, Any]] = {}  # committed first step -> (rollout, evidence)
        self.mismatches: list[tuple[dict[str, Any], Any]] = []  # (event, where)
        # version -> the first trainer's canary scores (cell, values, where); per engine its scores
        self.trainer_canary: dict[int, tuple[int | None, list[float], Any]] = {}
        self.other_trainers: dict[int, dict[int | None, tuple[list[float], Any]]] = {}  # version -> cell -> ...
        self.engine_canary: dict[int, dict[int, tuple[list[float], Any]]] = {}

    def on_event(self, ev: dict[str, Any], fi: int, line: int) -> None:
        kind = ev["type"]
        if kind in ("run_started", "run_resumed"):
            cfg = ev.get("config") or {}
            self.grpo = cfg.get("loss") == "grpo"
            tp = int(ev.get("tp") or cfg.get("tp") or 1)
            self.exact = tp == 1 and cfg.get("engine_kind", "megatron") == "megatron"
            tol = cfg.get("logprob_tolerance")
            ok = isinstance(tol, (int, float)) and not isinstance(tol, bool) and math.isfinite(tol) and tol > 0
            self.tolerance = float(tol) if ok and tol is not None else TOLERANCE
            pp = int(ev.get("pp") or cfg.get("pp") or 1)
            self.canaries = "loss" in cfg and pp == 1 and bool(ev.get("num_engines"))
            spr = int(cfg.get("steps_per_rollout") or 1)
            self.steps_per_rollout = max(1, spr)
            self.step_samples = int(cfg.get("samples_per_rollout") or 0) // self.steps_per_rollout
        elif kind == "weights_sent":
            self.sent[ev["version"]] = ev["total"]
        elif kind == "engine_weights":
            self.loaded.setdefault(ev["version"], {})[ev["engine"]] = ev["total"]
        elif kind == "canary_logprobs":
            self.check()
            where = self.replay.where(fi, line)
            if ev.get("engine") is not None:
                self.engine_canary.setdefault(ev["version"], {}).setdefault(ev["engine"], (ev["logprobs"], where))
            else:
                first = self.trainer_canary.setdefault(ev["version"], (ev.get("cell"), ev["logprobs"], where))
                if ev.get("cell") != first[0]:  # every other cell's trainer: its replica scores the same bits
                    self.other_trainers.setdefault(ev["version"], {}).setdefault(
                        ev.get("cell"), (ev["logprobs"], where)
                    )
        else:  # logprob_check
            self.check()
            self.compared.setdefault(ev["step"], set()).update(ev["witness_ids"])
            total = ev["total"]
            if total["differing"] and (self.exact or total["nonfinite"] or total["max_abs"] > self.tolerance):
                self.mismatches.append((ev, self.replay.where(fi, line)))

    def on_step(self, rec: StepRecord) -> None:
        if (self.grpo or self.canaries) and rec.committed and rec.step % self.steps_per_rollout == 0:
            self.first_steps.setdefault(rec.step, (rec.rollout, rec.evidence()))

    def _compare_canaries(self) -> None:
        """Every engine's canary scores of a version against the trainer's (first cell logged)."""
        for version, (cell, want, _) in sorted(self.trainer_canary.items()):
            for engine, (got, where) in sorted(self.engine_canary.get(version, {}).items()):
                if len(got) != len(want):
                    self.report(
                        f"engine {engine} scored {len(got)} canary tokens of version {version}, "
                        f"cell {cell}'s trainer {len(want)}",
                        engine=engine,
                        version=version,
                        where=where,
                    )
                    continue
                deltas = [_delta(a, b) for a, b in zip(got, want)]
                differing = sum(1 for a, b in zip(got, want) if a != b)
                worst = max(deltas, default=0.0)
                if not differing or (not self.exact and worst <= self.tolerance):
                    continue
                self.report(
                    f"canary log-probs of version {version}: engine {engine} differs from cell {cell}'s trainer on "
                    f"{differing} of {len(got)} tokens (max |delta| {worst:.3g}); likely cause: {self._cause(version)}",
                    severity=Severity.error if self.exact else Severity.warning,
                    engine=engine,
                    cell=cell,
                    version=version,
                    rollout=version,
                    where=where,
                )

    def _compare_trainers(self) -> None:
        """Every other cell's trainer canary scores of a version against the first cell's: the
        replicas hold the same bits, so they score the same bits (any difference is an error)."""
        for version, (cell, want, _) in sorted(self.trainer_canary.items()):
            for other, (got, where) in sorted(self.other_trainers.get(version, {}).items(), key=lambda kv: str(kv[0])):
                differing = len(got) != len(want) or any(a != b for a, b in zip(got, want))
                if differing:
                    self.report(
                        f"canary log-probs of version {version}: cell {other}'s trainer differs from cell {cell}'s "
                        f"({len(got)} vs {len(want)} tokens, max |delta| "
                        f"{max((_delta(a, b) for a, b in zip(got, want)), default=0.0):.3g}): the replicas are not "
                        "the same bits (see FT101)",
                        cell=other,
                        reference_cell=cell,
                        version=version,
                        rollout=version,
                        where=where,
                    )

    def _cause(self, version: int) -> str:
        sent, loaded = self.sent.get(version), self.loaded.get(version, {})
        if sent is None:
            return "unknown: the log holds no weights_sent for that version"
        stale = sorted(e for e, t in loaded.items() if t != sent and t == self.sent.get(version - 1))
        wrong = sorted(e for e, t in loaded.items() if t != sent and e not in stale)
        if stale:
            return f"stale weights: engine(s) {stale} still hold version {version - 1} (FT102)"
        if wrong:
            return f"wrong weights: engine(s) {wrong} hold weights other than those sent (FT102)"
        return "arithmetic: every engine holds exactly the weights sent and the recorded tokens were scored"

    def finish(self) -> None:
        for ev, where in self.mismatches:
            total, positions = ev["total"], ev["positions"]
            at = [k for k, p in enumerate(positions) if p["differing"]][:MAX_POSITIONS]
            worst = max(
                zip(ev["witness_ids"], ev["samples"]), key=lambda s: (s[1]["nonfinite"], s[1]["max_abs"]), default=None
            )
            exact = self.exact
            self.report(
                f"rollout {ev['rollout']} step {ev['step']} cell {ev['cell']} rank {ev['rank']}: "
                f"{total['differing']} of {total['tokens']} token log-probs differ from the engines' "
                f"(max |delta| {total['max_abs']:.3g}, mean {total['mean_abs']:.3g}, k3 {total['k3']:.3g}"
                + (f", {total['nonfinite']} non-finite" if total["nonfinite"] else "")
                + f") at response positions {at}; likely cause: {self._cause(ev['version'])}",
                severity=Severity.error if exact else Severity.warning,
                rollout=ev["rollout"],
                step=ev["step"],
                cell=ev["cell"],
                rank=ev["rank"],
                version=ev["version"],
                positions=at,
                worst_sample=None if worst is None else worst[0],
                where=where,
            )
        self._compare_canaries()
        self._compare_trainers()
        if self.replay.profile is not None:  # another producer's log (ftkit.evidence): nothing is owed here
            return
        for step, (rollout, evidence) in sorted(self.first_steps.items()):
            self.check()
            if self.canaries and (rollout not in self.trainer_canary or rollout not in self.engine_canary):
                side = "a trainer's" if rollout not in self.trainer_canary else "an engine's"
                self.report(
                    f"step {step} (rollout {rollout}) trained on version {rollout} without {side} canary scores "
                    "of it: nothing proves the engines held the weights the trainer had",
                    **evidence,
                )
            if not self.grpo:
                continue
            per_rollout = self.steps_per_rollout * self.step_samples
            want = set(range(rollout * per_rollout, (rollout + 1) * per_rollout))
            missing = sorted(want - self.compared.get(step, set()))
            if missing:
                self.report(
                    f"step {step} (rollout {rollout}) trained {len(missing)} sample(s) whose engine log-probs "
                    f"were never compared with the trainer's (first: {missing[:5]}): nothing proves they were "
                    "sampled from the trained policy",
                    samples=missing[:20],
                    **evidence,
                )
