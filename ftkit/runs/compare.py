"""``compare_runs``: the library entry point of ``ftkit compare-runs A B``.

    result = compare_runs(["runs/a"], ["runs/b"], RunsOptions())
    result.first_divergence   # None when every common step is equal, else a dict:
                              # step, rollout, what, tensor, message, also, differing_steps
    result.findings           # CR001-CR008 (ftkit.runs.codes), most severe first
    result.verdict            # "pass" | "fail"
    result.rule_seconds       # by code: the seconds its comparisons took (reading the logs is shared)

Both logs are read in step with each other (``Side.advance`` of the side that is behind), each
through the reader, demultiplexer, replay and integrity rules of ``analyze-events``; only the
committed attempt of each step counts. Steps are matched by their run-global number: cells,
incarnations, retries, heals, resumes and cell counts may differ. A damaged log (an integrity
error of ``analyze-events``) raises ``InputError`` (exit 2): it is never compared as if whole.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

from ftkit.analysis.parallel import WorkerLost, default_workers
from ftkit.errors import InputError, UsageError
from ftkit.events.reader import STDIN, discover, size_of
from ftkit.findings import FailOn, Finding, RuleSummary, sort_findings, verdict
from ftkit.runs import codes
from ftkit.runs.configs import config_diff, describe
from ftkit.runs.diff import ItemDiff, Tolerance, compare_item
from ftkit.runs.matcher import Matcher
from ftkit.runs.side import Side
from ftkit.runs.worker import RemoteSide

CHUNK = 4096  # events replayed from one side before the other may take its turn
MAX_LISTED = 1000  # differing steps listed in the result (all are counted)
KINDS = ("weights", "canary", "witness", "metric", "state")
Paths = Iterable[str | os.PathLike[str]]
Progress = Callable[[int, int], None]
AnySide = Side | RemoteSide


@dataclass(frozen=True)
class RunsOptions:
    tolerance: Tolerance = Tolerance()
    ignore_metrics: frozenset[str] = frozenset()
    require_same_length: bool = False


@dataclass
class RunsResult:
    a: list[str]
    b: list[str]
    options: RunsOptions
    findings: list[Finding]
    rules: list[RuleSummary]
    first_divergence: dict[str, Any] | None
    config: list[dict[str, Any]]
    kinds: dict[str, dict[str, Any]]
    steps: dict[str, Any]
    strip: list[dict[str, Any]]
    divergent: list[dict[str, Any]]
    sides: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    rule_seconds: dict[str, float] = field(default_factory=dict)  # by code: its comparisons' seconds

    @property
    def verdict(self) -> str:
        return verdict(self.findings, FailOn.error)


def compare_runs(
    a: Paths, b: Paths, options: RunsOptions | None = None, progress: Progress | None = None
) -> RunsResult:
    """Compare the runs logged under ``a`` and ``b`` (see the module docstring)."""
    options = options or RunsOptions()
    a_paths, b_paths = [str(p) for p in a], [str(p) for p in b]
    if "-" in a_paths and "-" in b_paths:
        raise UsageError("only one of A and B can be standard input ('-')", "pass the other run as a path")
    files = [discover(a_paths), discover(b_paths)]  # missing paths: InputError before any worker starts
    size = sum(size_of(p) for f in files for p in f)
    # a worker per run where analyze-events would take any (two streams: ftkit.analysis.parallel)
    remote = STDIN not in files[0] + files[1] and default_workers(2, size) > 0
    while True:
        matcher = Matcher()
        try:
            sides = _read(a_paths, b_paths, matcher, remote, progress)
        except WorkerLost:  # a worker refused or killed: both logs again, in this process
            remote = False
            continue
        _fail_closed(sides)
        return _result(a_paths, b_paths, options, matcher, sides)


def _read(a: list[str], b: list[str], matcher: Matcher, remote: bool, progress: Progress | None) -> list[AnySide]:
    """Both runs read to their end, in step with each other (``Side``, or ``RemoteSide``: each in
    a worker process of its own, with the same calls on ``matcher`` in the same order)."""

    def side(index: int, paths: list[str]) -> AnySide:
        return RemoteSide(index, paths, matcher, CHUNK) if remote else Side(index, paths, matcher)

    sides: list[AnySide] = [side(0, a)]
    try:
        sides.append(side(1, b))
        while not all(s.done for s in sides):
            current = min((s for s in sides if not s.done), key=lambda s: (s.closed_below, s.index))
            current.advance(CHUNK)
            if progress is not None:
                done = [s.progress() for s in sides]
                progress(sum(d for d, _ in done), sum(t for _, t in done))
    finally:
        for s in sides:
            s.close()
    return sides


def _fail_closed(sides: list[AnySide]) -> None:
    damaged = [(s, s.damage()) for s in sides]
    damaged = [(s, d) for s, d in damaged if d]
    if not damaged:
        return
    side, found = damaged[0]
    f = found[0]
    where = f" ({f.where()})" if f.where() else ""
    more = f"; {len(found) - 1} more integrity error(s)" if len(found) > 1 else ""
    also = f"; {damaged[1][0].label}'s log is damaged too" if len(damaged) > 1 else ""
    path = " ".join(map(str, side.paths))
    raise InputError(
        f"{side.label} ({path}) cannot be compared: its log is damaged: {f.code} {f.message}{where}{more}{also}",
        f"`ftkit analyze-events {path}` lists every finding; a cut or damaged log is never compared as if whole",
    )


def _result(a: list[str], b: list[str], options: RunsOptions, m: Matcher, sides: list[AnySide]) -> RunsResult:
    """The comparison of what both sides read; ``rule_seconds``: each code's own comparisons,
    timed (the evidence of a kind, the configs, the steps' coverage), the shared reading not."""
    seconds = dict.fromkeys(codes.CODES, 0.0)
    t0 = perf_counter()
    steps_a, steps_b = m.steps
    common = sorted(set(steps_a) & set(steps_b))
    coverage = _coverage(common, steps_a, steps_b, options)
    seconds["CR006"] = seconds["CR008"] = (perf_counter() - t0) / 2  # one pass checks both
    rollout_of = {**steps_b, **steps_a}
    first_of_rollout: dict[int, int] = {}
    for s in sorted(rollout_of, reverse=True):
        first_of_rollout[rollout_of[s]] = s
    la, lb = sides[0].ledger, sides[1].ledger
    t0 = perf_counter()
    rows = config_diff(la.config, lb.config, la.layout, lb.layout)
    cause = describe(rows)
    seconds["CR007"] = perf_counter() - t0
    notes: list[str] = []
    state_ok = (la.layout.get("tp"), la.layout.get("pp")) == (lb.layout.get("tp"), lb.layout.get("pp"))
    if not state_ok:
        notes.append("state fingerprints not compared: the runs' tp x pp layouts differ (per-rank shards differ)")
    same_scheme = la.scheme == lb.scheme
    if not same_scheme:
        notes.append(
            f"state and weight fingerprints not compared: A computes them as {la.scheme}, B as {lb.scheme} "
            "(docs/fingerprints.md)"
        )
    kinds = {k: {"compared": 0, "differ": 0, "a_only": 0, "b_only": 0} for k in KINDS}
    common_set = set(common)
    diffs: list[tuple[tuple[int, int, int], ItemDiff]] = []
    for key, (pos, va, vb) in m.entries.items():
        kind = "metric" if key[0] == "rmetric" else key[0]
        if va is None or vb is None:
            kinds[kind]["a_only" if vb is None else "b_only"] += 1
            continue
        if pos[1] >= 0 and pos[1] not in common_set or kind == "state" and not state_ok:
            continue
        if kind in ("state", "weights") and not same_scheme:
            continue
        t0 = perf_counter()
        got = compare_item(
            key[0], va, vb, m.detail(key, 0), m.detail(key, 1), options.tolerance, options.ignore_metrics
        )
        seconds[codes.KIND_CODES[kind]] += perf_counter() - t0
        if got is None:
            continue
        kinds[kind]["compared"] += 1
        if got[0]:
            continue
        kinds[kind]["differ"] += 1
        step = pos[1] if pos[1] >= 0 else first_of_rollout.get(pos[0], -1)
        ev = {**got[3], **({"version": key[-1]} if kind in ("weights", "canary") else {})}
        diffs.append((pos, ItemDiff(kind, key, pos[0], step, got[1], got[2], ev)))
    diffs.sort(key=lambda d: d[0])
    for kind, k in kinds.items():
        if k["compared"] == 0 and (k["a_only"] or k["b_only"]):
            who = "A" if k["a_only"] else "B"
            notes.append(f"{kind}: only {who}'s log holds this evidence; not compared")
    by_step: dict[int, list[str]] = {}
    for _, d in diffs:
        if d.step >= 0:
            whats = by_step.setdefault(d.step, [])
            if d.kind not in whats:
                whats.append(d.kind)
    first = _first(diffs, by_step, common)
    findings = _findings(diffs, kinds, first, cause, rows) + coverage
    checked = {codes.KIND_CODES[k]: v["compared"] for k, v in kinds.items()}
    checked.update({"CR006": 1, "CR007": 1, "CR008": 1})
    union = sorted(set(steps_a) | set(steps_b))
    return RunsResult(
        a=a,
        b=b,
        options=options,
        findings=sort_findings(findings),
        rules=codes.summaries(checked, findings),
        first_divergence=first,
        config=rows,
        kinds=kinds,
        steps={
            "a": len(steps_a),
            "b": len(steps_b),
            "common": len(common),
            "differ": sum(1 for s in by_step if s in common_set),
            "only_a": len(steps_a) - len(common),
            "only_b": len(steps_b) - len(common),
        },
        strip=_strip(union, common_set, by_step, steps_a),
        divergent=[{"step": s, "rollout": rollout_of[s], "what": w} for s, w in sorted(by_step.items())][:MAX_LISTED],
        sides=[s.stats() for s in sides],
        notes=notes + [f"{s.label}: {f.code} {f.message}" for s in sides for f in s.warnings()],
        rule_seconds=seconds,
    )


def _first(
    diffs: list[tuple[Any, ItemDiff]], by_step: dict[int, list[str]], common: list[int]
) -> dict[str, Any] | None:
    if not diffs:
        return None
    d = diffs[0][1]
    step = d.step if d.step >= 0 else None
    later = [s for s in by_step if step is not None and s >= step]
    return {
        "step": step,
        "rollout": d.rollout,
        "what": d.kind,
        "tensor": d.tensor,
        "message": d.message,
        "also": [k for k in by_step.get(d.step, []) if k != d.kind],
        "differing_steps": len(later),
        "common_steps_from": sum(1 for s in common if step is not None and s >= step),
        **({"version": d.evidence["version"]} if d.evidence and "version" in d.evidence else {}),
    }


def _findings(
    diffs: list[tuple[Any, ItemDiff]],
    kinds: dict[str, dict[str, Any]],
    first: dict[str, Any] | None,
    cause: str,
    rows: list[dict[str, Any]],
) -> list[Finding]:
    """The first divergence of each kind (CR001-CR005) and the configs' differences (CR007)."""
    out: list[Finding] = []
    because = f"; the configs differ: {cause}" if cause else ""
    seen: set[str] = set()
    for _, d in diffs:
        if d.kind in seen:
            continue
        seen.add(d.kind)
        k = kinds[d.kind]
        at = f"step {d.step} (rollout {d.rollout})" if d.step >= 0 else f"rollout {d.rollout}"
        version = f", version {d.evidence['version']}" if d.evidence and "version" in d.evidence else ""
        out.append(
            codes.finding(
                codes.KIND_CODES[d.kind],
                f"{codes.KIND_TEXT[d.kind]}: {k['differ']} of {k['compared']} compared differ; first at {at}"
                f"{version}: {d.message}{because}",
                step=d.step if d.step >= 0 else None,
                rollout=d.rollout,
                tensor=d.tensor,
                count=k["differ"],
                **{x: y for x, y in (d.evidence or {}).items() if x != "version" or d.kind in ("weights", "canary")},
            )
        )
    if rows:
        text = "; ".join(f"{r['field']} {r['a']!r} vs {r['b']!r} ({r['kind']})" for r in rows[:12])
        out.append(codes.finding("CR007", f"the configs differ: {text}", fields=[r["field"] for r in rows]))
    return out


def _coverage(
    common: list[int], steps_a: dict[int, int], steps_b: dict[int, int], options: RunsOptions
) -> list[Finding]:
    """No committed step in common (CR008), or steps one run committed and the other did not (CR006)."""
    if not common:
        text = f"no committed step in common (A: {len(steps_a)}, B: {len(steps_b)}): nothing was compared"
        return [codes.finding("CR008", text)]
    if len(steps_a) != len(common) or len(steps_b) != len(common):
        return [_length(common, steps_a, steps_b, options)]
    return []


def _length(common: list[int], steps_a: dict[int, int], steps_b: dict[int, int], options: RunsOptions) -> Finding:
    from dataclasses import replace

    only = {"A": sorted(set(steps_a) - set(common)), "B": sorted(set(steps_b) - set(common))}
    parts = [f"{who} committed {len(s)} step(s) the other did not ({_span(s)})" for who, s in only.items() if s]
    prefix = all(not s or s[0] > common[-1] for s in only.values())
    text = "; ".join(parts) + (
        f"; the {len(common)} common steps were compared" + ("" if prefix else " (not a prefix: steps missing inside)")
    )
    f = codes.finding("CR006", text, only_a=len(only["A"]), only_b=len(only["B"]), prefix=prefix)
    if options.require_same_length or not prefix:
        from ftkit.findings import Severity

        f = replace(f, severity=Severity.error)
    return f


def _span(steps: list[int]) -> str:
    return f"{steps[0]}-{steps[-1]}" if len(steps) > 1 else str(steps[0])


def _strip(
    union: list[int], common: set[int], by_step: dict[int, list[str]], steps_a: dict[int, int]
) -> list[dict[str, Any]]:
    """Run-length encoded status of every step: equal, differs, only_a, only_b."""
    out: list[dict[str, Any]] = []
    for s in union:
        status = ("differs" if s in by_step else "equal") if s in common else ("only_a" if s in steps_a else "only_b")
        if out and out[-1]["status"] == status and out[-1]["to"] + 1 == s:
            out[-1]["to"] = s
            out[-1]["count"] += 1
        else:
            out.append({"from": s, "to": s, "status": status, "count": 1})
    return out
