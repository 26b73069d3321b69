"""Self-contained HTML report of ``ftkit analyze-events --html FILE``: the forensic story of a run.

Sections, top to bottom: the verdict and run summary; the **timeline** (x = seconds since
the first event; lanes: driver, steps, one per cell, one per engine; cells coloured by state,
faults / detections / heals / reconfigures / discarded attempts / weight pushes / engine
loads / checkpoints drawn as marks with hover text; a zoom slider widens the drawing inside
a scroller); the **metrics** (reward, loss, grad norm, tokens/s, ... against the step, bin
mean as a line and min-max as a band when steps are aggregated, injected faults as red
rules, discarded attempts as orange ticks); the **recovery table**; the **rule table**;
the **findings** (collapsed, searchable, linked to file and line) and the list of timeline
events (searchable).

Drawing is hand-made SVG (see docs/reports.md for the measurement behind that choice). The
timeline SVG uses ``preserveAspectRatio='none'`` with ``non-scaling-stroke`` marks, so it
stretches horizontally with the zoom while text (HTML labels and axis ticks placed in
percent) stays crisp.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from html import escape
from pathlib import Path
from typing import Any

from ftkit.analysis.engine import AnalysisResult
from ftkit.analysis.timeline_model import Marker, StepBin, Timeline
from ftkit.report.html_page import (
    MAX_ROWS,
    check_target,
    finding_list,
    fmt_s,
    kv,
    legend,
    nice_ticks,
    num,
    page,
    page_dir,
    table,
    where_link,
    write_page,
)
from ftkit.report.logprob_html import logprob_section
from ftkit.report.metric_charts import metric_charts

__all__ = ["check_target", "render_timeline_html", "write_report"]

STATE_COLORS = {
    "alive": "#2da44e",
    "failed": "#cf222e",
    "restarting": "#d4a72c",
    "healing": "#8250df",
    "starting": "#54aeff",
    "pending": "#d0d7de",
    "stopped": "#8c959f",
}
MARK_STYLE = {  # kind -> (colour, stroke width, dash, legend text); one colour, one meaning:
    # black the injected cause, red a failure (as the failed state), purple healing, blue a
    # membership change, orange a step that did not commit, teal weights moving, grey a
    # checkpoint, pink a rejected one, dark red an analyzer finding
    "fault": ("#24292f", 3, "", "fault injected"),
    "detected": ("#cf222e", 2, "", "failure detected"),
    "heal": ("#8250df", 3, "", "heal"),
    "reconfigure": ("#0969da", 2, "", "reconfigure"),
    "discarded": ("#fb8f44", 2, "3 2", "attempt not committed"),
    "weights": ("#1b7c83", 1, "", "weights pushed / loaded"),
    "engine": ("#1b7c83", 1, "", "weights pushed / loaded"),
    "checkpoint": ("#57606a", 2, "", "checkpoint"),
    "rejected": ("#bf3989", 2, "1 2", "checkpoint rejected"),
    "finding": ("#82071e", 4, "", "analyzer finding"),
}
COMMITTED, NOT_COMMITTED = STATE_COLORS["alive"], MARK_STYLE["discarded"][0]  # the steps lane's blocks
LISTED = ("fault", "detected", "heal", "reconfigure", "discarded", "rejected")  # in the searchable event list
DENSE = 100  # marks of one kind on one lane drawn one by one up to this many, bucketed beyond
_LANE_H, _W = 22, 1000.0

_TIMELINE_CSS = """<style>
.tl{display:grid;grid-template-columns:92px minmax(0,1fr);margin:6px 0}
.tl .lab div{height:22px;line-height:22px;font-size:12px;white-space:nowrap;overflow:hidden}
.tl .inner{position:relative;width:100%}.tl svg{display:block;width:100%}
.tl .axis{position:relative;height:18px;font-size:11px;color:#57606a}
.tl .axis span{position:absolute;transform:translateX(-50%);white-space:nowrap}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(420px,100%),1fr));gap:8px 18px}
@media (max-width:640px){.tl .axis span:nth-child(even){display:none}}
.charts svg{width:100%;height:auto}
</style>"""
_ZOOM_JS = """
(function(){var z=document.getElementById('zoom'),inner=document.querySelectorAll('.tl-inner'),
out=document.getElementById('zoom-out');if(!z||!inner.length){return;}
z.addEventListener('input',function(){var f=Math.pow(2,+z.value);
for(var i=0;i<inner.length;i++){inner[i].style.width=(100*f)+'%';}out.textContent=f+'x';});
var s=document.getElementById('startup-scale');if(!s){return;}
s.addEventListener('change',function(){document.getElementById('tl-compressed').hidden=s.checked;
document.getElementById('tl-linear').hidden=!s.checked;});})();
"""


def write_report(path: Path, paths: Iterable[str | os.PathLike[str]], result: AnalysisResult, outcome: str) -> None:
    """Build the timeline of the logs under ``paths`` (a second streaming pass, read the way the
    analyzer read them) and write the page for ``result`` to ``path`` atomically."""
    from ftkit.analysis.timeline import build_timeline

    timeline = build_timeline(paths, per_process=result.stats.get("read_as") == "per-process")
    write_page(path, render_timeline_html(timeline, result, outcome, page_dir(path)))


def render_timeline_html(timeline: Timeline, result: AnalysisResult, outcome: str, base: Path | None) -> str:
    """The whole page for one analysed run (``outcome``: the analyzer's verdict); links to the
    logs are relative to ``base`` (``html_page.where_link``)."""
    run = timeline.run or (result.stats.get("runs") or ["?"])[0]
    body = [
        f"<h1>ftkit analyze-events: <span class='{outcome}'>{outcome.upper()}</span> "
        f"<span class='muted'>run {escape(str(run))}</span></h1>",
        _summary(timeline, result),
        "<h2>Timeline</h2>",
        _timeline(with_findings(timeline, result)),
        "<h2>Metrics by step</h2>",
        metric_charts(timeline),
        "<h2>Recovery</h2>",
        _recovery(result.recovery, base),
        "<h2>Engine vs trainer log-probs</h2>",
        logprob_section(timeline.logprobs),
        "<h2>Rules</h2>",
        _rules(result),
        "<h2>Findings</h2>",
        finding_list(result.findings, "findings", base),
        "<h2>Timeline events</h2>",
        _event_list(timeline, base),
    ]
    return page(f"ftkit analyze-events: {run}", body, _ZOOM_JS)


def with_findings(tl: Timeline, result: AnalysisResult) -> Timeline:
    """``tl`` plus one ``finding`` mark on the steps lane per finding whose evidence names a step
    the timeline holds (at the end of that step's block), so a FAIL run shows where it failed."""
    from dataclasses import replace

    marks = []
    for f in result.findings:
        step = f.evidence.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            continue
        b = next((b for b in tl.bins if b.first <= step < b.first + tl.width and b.attempts), None)
        if b is not None:
            label = f"{f.code} {f.rule} at step {step}: {f.message}"
            marks.append(
                Marker(
                    "finding",
                    b.t1,
                    "steps",
                    label,
                    str(f.evidence.get("file") or ""),
                    int(f.evidence.get("line") or 0),
                    step,
                )
            )
    return replace(tl, markers=[*tl.markers, *marks]) if marks else tl


def _summary(tl: Timeline, result: AnalysisResult) -> str:
    s = result.stats
    layout = f"{s.get('cells')} cell(s) x tp {s.get('tp')} x pp {s.get('pp')}, {s.get('engines')} engine(s)"
    notes = "".join(f"<p class='muted'>{escape(n)}</p>" for n in result.notes)
    dropped = ", ".join(f"{n} {k}" for k, n in sorted(tl.dropped.items()))
    if dropped:
        notes += f"<p class='muted'>Not drawn (over the per-kind limit): {escape(dropped)}</p>"
    if tl.skipped:
        notes += f"<p class='muted'>{tl.skipped} event(s) lack the fields the timeline needs (see the findings).</p>"
    return (
        kv(
            [
                ("status", escape(str(s.get("status") or "no run_finished"))),
                ("layout", escape(layout)),
                ("steps", f"{s.get('steps_committed')} committed of {s.get('steps_closed')} closed"),
                ("faults / heals", f"{s.get('faults')} / {s.get('heals')}"),
                ("engine restarts", str(s.get("engine_restarts", 0))),
                ("duration", f"{num(s.get('duration_s'), '.3f')} s"),
                ("events", f"{s.get('events')} in {s.get('files')} file(s), {s.get('bytes')} bytes"),
            ]
        )
        + notes
    )


# ---------------------------------------------------------------------------- timeline
def _lanes(tl: Timeline) -> list[str]:
    cells = sorted((k for k in tl.lanes if k.startswith("cell ")), key=lambda k: int(k.split()[1]))
    marked = {m.lane for m in tl.markers}
    for lane in sorted(marked):
        if lane.startswith("cell ") and lane not in cells:
            cells.append(lane)
    engines = sorted((k for k in marked if k.startswith("engine ")), key=lambda k: int(k.split()[1]))
    return ["driver", "steps", *cells, *engines]


def _timeline(tl: Timeline) -> str:
    """The lanes, drawn on ``time_axis``; a compressed start-up gets a checkbox that swaps in
    the same lanes on a linear axis (the start-up to scale), and back."""
    if not tl.events:
        return "<p>No events.</p>"
    lanes = _lanes(tl)
    span = tl.duration or 1.0
    x, t_train = time_axis(tl)
    offset = t_train - tl.start
    track = _track(tl, lanes, x, t_train)
    if offset:
        linear, _ = time_axis(tl, compress=False)
        track = (
            "<label><input type='checkbox' id='startup-scale'> start-up to scale "
            f"({fmt_s(offset)}, {offset / span:.0%} of the run)</label>"
            f"<div id='tl-compressed'>{track}</div><div id='tl-linear' hidden>"
            f"{_track(tl, lanes, linear, tl.start)}</div>"
        )
        startup_note = (
            f" The start-up ({fmt_s(offset)} before the first step, {offset / span:.0%} of the run) is drawn "
            f"compressed in the shaded first {STARTUP_SHARE:.0%} of the width, so the training span fills the rest; "
            "'start-up to scale' shows it linearly."
        )
    else:
        startup_note = ""
    return (
        _TIMELINE_CSS
        + legend([(s, c) for s, c in STATE_COLORS.items()])
        + legend(list(dict.fromkeys((text, c) for c, _, _, text in MARK_STYLE.values())))
        + "<label>zoom <input id='zoom' type='range' min='0' max='8' step='1' value='0'> <span id='zoom-out'>1x</span>"
        "</label> " + track + f"<p class='muted'>x: seconds since the first event ({fmt_s(span)} in all). Steps lane: "
        f"{tl.width} step(s) per block; orange blocks hold attempts that did not commit; dark red marks are "
        f"the analyzer's findings at their step.{startup_note} Hover for details.</p>"
    )


def _track(tl: Timeline, lanes: list[str], x: Any, t_train: float) -> str:
    """The lane labels, the SVG of the lanes and the seconds axis, positions from ``x``
    (``time_axis``); ``t_train`` after ``tl.start``: the start-up is compressed and shaded."""
    row = {lane: i for i, lane in enumerate(lanes)}
    span = tl.duration or 1.0
    h = len(lanes) * _LANE_H
    out = [
        f"<svg viewBox='0 0 {_W:.0f} {h}' preserveAspectRatio='none' height='{h}' role='img' aria-label='run timeline'>"
    ]
    for i in range(len(lanes)):
        fill = "#f6f8fa" if i % 2 else "#ffffff"
        out.append(f"<rect x='0' y='{i * _LANE_H}' width='{_W:.0f}' height='{_LANE_H}' fill='{fill}'/>")
    for lane, intervals in tl.lanes.items():
        y = row[lane] * _LANE_H
        for iv in intervals:
            top, hh = (y + 3, _LANE_H - 6) if iv.state != "healing" else (y + 6, _LANE_H - 12)
            x0, x1 = x(iv.start), x(iv.end)
            why = f" ({iv.reason})" if iv.reason else ""
            out.append(
                f"<rect class='state-{iv.state}' x='{x0:.2f}' y='{top}' width='{max(x1 - x0, 0.3):.2f}' height='{hh}' "
                f"fill='{STATE_COLORS.get(iv.state, '#afb8c1')}'><title>{escape(lane)}: {iv.state}{escape(why)}, "
                f"{iv.start - tl.start:.3f}s to {iv.end - tl.start:.3f}s</title></rect>"
            )
    y = row["steps"] * _LANE_H
    for b in tl.bins:
        if b.attempts:
            out.append(_step_rect(b, tl, x, y))
    for group in _mark_groups(tl):
        m = group[0]
        colour, width, dash, _ = MARK_STYLE[m.kind]
        y = row.get(m.lane, 0) * _LANE_H
        xm = x(m.time)
        dash_attr = f" stroke-dasharray='{dash}'" if dash else ""
        text = f"{m.label} at {m.time - tl.start:.3f}s"
        if len(group) > 1:
            text = f"{len(group)} x {MARK_STYLE[m.kind][3]}, first: {text}; last: {group[-1].label}"
        out.append(
            f"<line class='mark-{m.kind}' x1='{xm:.2f}' x2='{xm:.2f}' y1='{y + 1}' y2='{y + _LANE_H - 1}' "
            f"stroke='{colour}' stroke-width='{width}'{dash_attr} vector-effect='non-scaling-stroke'>"
            f"<title>{escape(text)}</title></line>"
        )
    out.append("</svg>")
    labels = "".join(f"<div title='{escape(lane)}'>{escape(lane)}</div>" for lane in lanes)
    offset, trained = t_train - tl.start, tl.end - t_train
    seconds = [0.0] + [offset + t for t in nice_ticks(trained, 10)] if offset else nice_ticks(span, 10)
    ticks = "".join(
        f"<span style='left:{x(tl.start + t) / _W * 100:.2f}%{';transform:none' if not t else ''}'>{fmt_s(t)}</span>"
        for t in seconds
        if x(tl.start + t) < _W * 0.97 and (not t or x(tl.start + t) > _W * STARTUP_SHARE + 30)
    )
    if offset:
        out.insert(
            1 + len(lanes),
            f"<rect class='startup' x='0' y='0' width='{_W * STARTUP_SHARE:.0f}' height='{h}' fill='#8c959f' "
            f"fill-opacity='0.18'><title>start-up: {fmt_s(offset)} before the first step, drawn compressed"
            "</title></rect>",
        )
    return (
        f"<div class='tl'><div class='lab'>{labels}</div><div class='scroll'><div class='inner tl-inner'>"
        + "".join(out)
        + f"<div class='axis'>{ticks}</div></div></div></div>"
    )


STARTUP_SHARE = 0.08  # of the width, for a start-up drawn compressed
STARTUP_LONG = 0.25  # a start-up longer than this share of the run is compressed


def time_axis(tl: Timeline, compress: bool = True) -> tuple[Any, float]:
    """``(x, t_train)``: ``x(t)`` maps a log time into ``[0, _W]``; ``t_train`` is when the first
    step began. When the start-up before it takes over ``STARTUP_LONG`` of the run (Ray and
    megatron starting: 43 of 51 s), it is compressed into the first ``STARTUP_SHARE`` of the
    width, so faults and heals during training are not squeezed to one edge; otherwise
    (and with ``compress=False``) ``t_train`` is the first event and the axis is linear."""
    span = tl.duration or 1.0
    first = min((b.t0 for b in tl.bins if b.attempts and math.isfinite(b.t0)), default=tl.start)
    startup = first - tl.start
    if not compress or startup <= STARTUP_LONG * span or tl.end <= first:

        def linear(t: float) -> float:
            return max(0.0, min(_W, (t - tl.start) / span * _W))

        return linear, tl.start
    a, rest = _W * STARTUP_SHARE, tl.end - first

    def piecewise(t: float) -> float:
        if t <= first:
            return max(0.0, (t - tl.start) / startup * a)
        return min(_W, a + (t - first) / rest * (_W - a))

    return piecewise, first


def _mark_groups(tl: Timeline) -> list[list[Marker]]:
    """Marks to draw: each alone while a (lane, kind) has at most ``DENSE`` of them, else grouped
    into ``DENSE`` equal time buckets (one line per bucket, its hover text counts them)."""
    by: dict[tuple[str, str], list[Marker]] = {}
    for m in tl.markers:
        by.setdefault((m.lane, m.kind), []).append(m)
    groups: list[list[Marker]] = []
    span = tl.duration or 1.0
    for marks in by.values():
        if len(marks) <= DENSE:
            groups.extend([m] for m in marks)
            continue
        buckets: dict[int, list[Marker]] = {}
        for m in marks:
            buckets.setdefault(min(int((m.time - tl.start) / span * DENSE), DENSE - 1), []).append(m)
        groups.extend(buckets.values())
    return groups


def _step_rect(b: StepBin, tl: Timeline, x: Any, y: int) -> str:
    x0, x1 = x(b.t0), x(b.t1)
    colour = NOT_COMMITTED if b.not_committed else COMMITTED
    steps = f"step {b.first}" if tl.width == 1 else f"steps {b.first}-{b.first + tl.width - 1}"
    return (
        f"<rect class='steps' x='{x0:.2f}' y='{y + 4}' width='{max(x1 - x0, 0.3):.2f}' height='{_LANE_H - 8}' "
        f"fill='{colour}' fill-opacity='0.75'><title>{steps}: {b.attempts} attempt(s), {b.committed} committed, "
        f"{b.not_committed} not committed</title></rect>"
    )


# ---------------------------------------------------------------------------- tables
def _recovery(rows: list[dict[str, Any]], base: Path | None) -> str:
    if not rows:
        return "<p class='muted'>No injected faults in this log.</p>"
    body = [
        (
            str(r["index"]),
            escape(f"{r['kind']} at {r['point']}"),
            num(r.get("cell")),
            num(r.get("step")),
            _secs(r.get("detect_s")),
            _secs(r.get("reconfigure_s")),
            _secs(r.get("next_commit_s")),
            _secs(r.get("heal_s")),
            num(r.get("heal_bytes")),
            str(r.get("steps_discarded", 0)),
            num(r.get("samples_lost")),
            escape(str(r.get("recovered_by") or "UNRECOVERED")),
            where_link(r.get("file"), r.get("line"), base),
        )
        for r in rows
    ]
    header = (
        "#",
        "fault",
        "cell",
        "step",
        "detected after",
        "reconfigured after",
        "next commit after",
        "healed after",
        "heal bytes",
        "attempts discarded",
        "samples lost",
        "recovered by",
        "logged at",
    )
    return table(header, body, "recovery")


def _secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}s"


_RULE_CLASS = {"failed": "fail", "passed": "pass", "not run": "muted", "not covered": "muted"}
_COUNTED = ("failed", "passed")  # statuses whose findings column is a count


def _rules(result: AnalysisResult) -> str:
    rows = [
        (
            escape(r.code),
            escape(r.rule),
            f"<span class='sev-{r.severity.value}'>{r.severity.value}</span>",
            f"<span class='sev-warning'>{escape(r.not_covered)}</span>"
            if r.not_covered
            else f"<span class='num'>{r.checked}</span>",
            f"<span class='{_RULE_CLASS[r.status]}'>{r.findings if r.status in _COUNTED else r.status}</span>",
            escape(r.description),
        )
        for r in result.rules
    ]
    return table(("code", "rule", "severity", "checked", "findings", "what it checks"), rows, "rules")


def _event_list(tl: Timeline, base: Path | None) -> str:
    marks: list[Marker] = [m for m in tl.markers if m.kind in LISTED]
    if not marks:
        return "<p class='muted'>No faults, heals, reconfigures, discarded attempts or rejected checkpoints.</p>"
    rows = [
        (
            f"<span class='num'>{m.time - tl.start:.3f}s</span>",
            escape(MARK_STYLE[m.kind][3]),
            escape(m.lane),
            escape(m.label),
            where_link(m.file, m.line, base),
        )
        for m in marks[:MAX_ROWS]
    ]
    more = len(marks) - len(rows)
    note = f"<p class='muted'>{more} more not listed (the timeline draws them).</p>" if more else ""
    return (
        f"<details{' open' if len(rows) <= 30 else ''}><summary>{len(marks)} event(s)</summary>"
        "<input class='search' type='search' placeholder='filter events' data-filter='tl-events'>"
        + table(("at", "what", "lane", "detail", "logged at"), rows, "tl-events")
        + note
        + "</details>"
    )
