"""The metric charts of the ``analyze-events --html`` page: one small SVG per metric against the step.

``reward``, ``loss``, ``grad_norm`` and ``tokens_per_s`` first, then any other metric, at most
``MAX_CHARTS``. Each point is a step bin of the timeline (``ftkit.analysis.timeline``): the
bin mean as a line, its min-max as a band when a bin holds several steps; injected faults are
dashed red rules and attempts that did not commit orange ticks, each kind one SVG path per
chart however many there are.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from ftkit.analysis.timeline_model import Timeline
from ftkit.report.html_page import legend, nice_ticks

METRIC_ORDER = ("reward", "loss", "grad_norm", "tokens_per_s")
FAULT, DISCARDED = "#24292f", "#fb8f44"  # the timeline's colours for the same marks
MAX_CHARTS = 6
_CW, _CH, _CL, _CB, _CT = 620, 200, 72, 30, 34  # chart width, height, left, bottom and top margins


def metric_charts(tl: Timeline) -> str:
    """One chart per metric (at most ``MAX_CHARTS``), or a line saying there are none."""
    names = [n for n in METRIC_ORDER if n in tl.metric_names]
    names += [n for n in tl.metric_names if n not in names]
    names = names[:MAX_CHARTS]
    if not names or not tl.bins:
        return "<p>No metrics in the log.</p>"
    faults = sorted({m.step for m in tl.markers_of("fault") if m.step is not None})
    discarded = sorted({m.step for m in tl.markers_of("discarded") if m.step is not None})
    charts = [_chart(name, tl, faults, discarded) for name in names]
    agg = f" Each point is the mean of {tl.width} steps; the band spans their min and max." if tl.width > 1 else ""
    return (
        legend([("injected fault", FAULT), ("attempt not committed", DISCARDED)])
        + "<div class='charts'>"
        + "".join(charts)
        + f"</div><p class='muted'>x: optimizer step.{agg}</p>"
    )


def _chart(name: str, tl: Timeline, faults: Sequence[int], discarded: Sequence[int]) -> str:
    pts = [(b.first + (tl.width - 1) / 2, b.metrics[name]) for b in tl.bins if name in b.metrics]
    if not pts:
        return f"<p class='muted'>{escape(name)}: no finite values.</p>"
    lo = min(s[2] for _, s in pts)
    hi = max(s[3] for _, s in pts)
    if hi - lo < 1e-12 * max(abs(hi), 1.0):
        lo, hi = lo - 0.5 * (abs(lo) or 1.0), hi + 0.5 * (abs(hi) or 1.0)
    first, last = tl.bins[0].first, tl.bins[-1].first + tl.width - 1
    pw, ph = _CW - _CL - 10, _CH - _CB - _CT

    def sx(step: float) -> float:
        return _CL + (step - first) / max(last - first, 1) * pw

    def sy(v: float) -> float:
        return _CT + (hi - v) / (hi - lo) * ph

    out = [
        f"<svg viewBox='0 0 {_CW} {_CH}' class='chart' data-metric='{escape(name)}' role='img' "
        f"aria-label='{escape(name)} by step'>",
        f"<text class='title' x='{_CL}' y='{_CT - 8}'>{escape(name)}</text>",
    ]
    for v in y_ticks(lo, hi):
        out.append(
            f"<line x1='{_CL}' x2='{_CW - 10}' y1='{sy(v):.1f}' y2='{sy(v):.1f}' stroke='#eaeef2'/>"
            f"<text x='{_CL - 6}' y='{sy(v) + 5:.1f}' text-anchor='end'>{tick_label(v)}</text>"
        )
    for s in nice_ticks(last - first, 8):
        step = first + s
        out.append(f"<text x='{sx(step):.1f}' y='{_CH - 8}' text-anchor='middle'>{step:.0f}</text>")
    for cls, steps, colour, y0, y1, title in (
        ("chart-discarded", discarded, DISCARDED, _CH - _CB - 8, _CH - _CB, "attempt not committed at step"),
        ("chart-fault", faults, FAULT, _CT, _CH - _CB, "fault injected at step"),
    ):
        xs = sorted({round(sx(step)) for step in steps})  # one stroke per pixel column, however many
        if xs:
            path = "".join(f"M{x} {y0}V{y1}" for x in xs)
            listed = ", ".join(str(st) for st in steps[:40]) + (" ..." if len(steps) > 40 else "")
            dash = " stroke-dasharray='4 3'" if cls == "chart-fault" else ""
            out.append(
                f"<path class='{cls}' d='{path}' stroke='{colour}' stroke-width='1.5'{dash}>"
                f"<title>{title} {listed}</title></path>"
            )
    if tl.width > 1:
        band = [f"{sx(s):.1f},{sy(st[3]):.1f}" for s, st in pts] + [
            f"{sx(s):.1f},{sy(st[2]):.1f}" for s, st in reversed(pts)
        ]
        out.append(f"<polygon points='{' '.join(band)}' fill='#0969da' fill-opacity='0.15'/>")
    line = " ".join(f"{sx(s):.1f},{sy(st[1] / st[0]):.1f}" for s, st in pts)
    out.append(f"<polyline points='{line}' fill='none' stroke='#0969da' stroke-width='1.5'/>")
    if len(pts) <= 200:
        for s, st in pts:
            out.append(
                f"<circle cx='{sx(s):.1f}' cy='{sy(st[1] / st[0]):.1f}' r='2.5' fill='#0969da'>"
                f"<title>step {s:.0f}: {name} {st[1] / st[0]:.6g}</title></circle>"
            )
    out.append("</svg>")
    return "".join(out)


def y_ticks(lo: float, hi: float) -> list[float]:
    """Round values (1, 2 or 5 times a power of ten apart) from ``lo`` to ``hi``, 3 to 6 of them."""
    offsets = nice_ticks(hi - lo, 4)
    step = offsets[1] if len(offsets) > 1 else (hi - lo) or 1.0
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    v = first
    while v <= hi + step * 1e-9:
        ticks.append(0.0 if abs(v) < step * 1e-9 else v)
        v += step
    return ticks or [lo, hi]


def tick_label(v: float) -> str:
    """A short label for a round tick value: ``0.25``, ``1.5k``, ``2M``, ``1e-05``."""
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1e4:
        return f"{v / 1e3:.3g}k"
    return f"{v:.3g}"
