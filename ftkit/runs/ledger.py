"""``Ledger``: what one run's replay hands to the ``Matcher``, committed steps only.

A ``Ledger`` rides along a ``ftkit.analysis.replay.Replay`` as one more rule (it reports
nothing): the replay sorts the log into step attempts and closes each once all of it is read,
so the ledger sees the *committed* attempt of every step with its state fingerprints and
witness counts from every cell, whatever the cells, incarnations, retries and heals were. Of
the cells that committed it takes, per rank, the fingerprint most of them hold (they are equal
in a run without FT101 findings). From the events themselves it takes the driver's metrics,
the weights sent to the engines and the canary log-probs, and from ``run_started`` /
``run_resumed`` the run's config and layout; a ``run_resumed`` retracts what the earlier
session logged after its checkpoint (``Matcher.retract``).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any

import orjson

from ftkit.analysis.records import StepRecord
from ftkit.analysis.registry import Rule
from ftkit.runs.matcher import ORDER, Matcher


class Ledger(Rule):
    """One run's evidence for the ``Matcher`` (a rule that is never registered)."""

    code = "compare-runs"
    name = "compare-runs-ledger"
    description = "collects the committed evidence of one run for compare-runs"
    fix = ""
    events = ("run_started", "run_resumed", "metric", "weights_sent", "canary_logprobs")

    def __init__(self, replay: Any, matcher: Matcher, side: int) -> None:
        super().__init__(replay)
        self.matcher, self.side = matcher, side
        self.config: dict[str, Any] | None = None
        self.layout: dict[str, Any] = {}
        self.scheme = "ftkit-fp1"  # how the run's fingerprints are computed (run_started)
        self.layout_changes: list[dict[str, Any]] = []
        self.sessions = 0
        self.producer: str | None = None

    # ------------------------------------------------------------------ steps
    def on_step(self, rec: StepRecord) -> None:
        if not rec.committed:
            return  # a discarded or failed attempt: its evidence is not the run's
        m, side, step, rollout = self.matcher, self.side, rec.step, rec.rollout
        m.step(side, step, rollout)
        if rec.fingerprints:
            totals: dict[Any, str] = {}
            detail: dict[Any, tuple[dict[str, str], dict[str, str]]] = {}
            for rank, by_cell in rec.fingerprints.items():
                held = [t for c, t in by_cell.items() if c in rec.committed_cells] or list(by_cell.values())
                total = Counter(held).most_common(1)[0][0]
                totals[rank] = total
                got = rec.fp_detail.get((rank, total))
                if got is not None and got[0] is not None:
                    detail[rank] = (got[0], got[1])
            value = tuple(sorted(totals.items(), key=lambda kv: -1 if kv[0] is None else kv[0]))
            m.put(side, ("state", step), (rollout, step, ORDER["state"]), value, detail)
        if rec.witness is not None:
            ids, counts = rec.witness[0], rec.witness[1]
            digest = hashlib.blake2b(orjson.dumps([ids, counts]), digest_size=16).digest()
            m.put(side, ("witness", step), (rollout, step, ORDER["witness"]), digest, (ids, counts))

    # ------------------------------------------------------------------ events
    def on_event(self, ev: dict[str, Any], fi: int, line: int) -> None:
        t = ev["type"]
        if t == "metric":
            if (ev["source"] or {}).get("role") != "driver":
                return
            values = dict(ev["values"])
            if ev["step"] is None:
                key, pos = ("rmetric", ev["rollout"]), (ev["rollout"], -1, ORDER["rmetric"])
            else:
                key, pos = ("metric", ev["step"]), (ev["rollout"], ev["step"], ORDER["metric"])
            m = self.matcher.entries.get(key)
            if m is not None and m[1 + self.side] is not None and m[0] == pos:
                values = {**m[1 + self.side], **values}  # several metric lines of one step
            self.matcher.put(self.side, key, pos, values)
        elif t == "weights_sent":
            pos = (ev["rollout"], -1, ORDER["weights"])
            self.matcher.put(self.side, ("weights", ev["version"]), pos, ev["total"], ev["params"])
        elif t == "canary_logprobs":
            who = "engine" if ev.get("engine") is not None else "trainer"
            pos = (ev["rollout"], -1, ORDER["canary"])
            self.matcher.put(self.side, ("canary", who, ev["version"]), pos, tuple(ev["logprobs"]))
        elif t == "run_started":
            if self.config is None:
                self._session(ev)
        else:  # run_resumed
            if self.config is None:
                self._session(ev)
            else:
                self.sessions += 1
            if ev.get("layout_change"):
                self.layout_changes.append({"after_step": ev["checkpoint_step"], **ev["layout_change"]})
            self.matcher.retract(self.side, ev["checkpoint_step"], ev["checkpoint_rollout"])

    def _session(self, ev: dict[str, Any]) -> None:
        self.config = dict(ev["config"]) if isinstance(ev["config"], dict) else {}
        self.layout = {"cells": ev["num_cells"], "tp": ev["tp"], "pp": ev["pp"], "engines": ev["num_engines"]}
        self.scheme = str(ev.get("fingerprint_scheme") or "ftkit-fp1")
        self.sessions = 1
