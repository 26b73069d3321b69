"""Self-contained HTML report of ``ftkit compare-dumps --html FILE`` (no external assets).

Sections: verdict and summary, first divergence, a per-layer divergence plot (inline SVG,
log scale, hover titles), the worst tensors, and the findings. A *layer* is the module path
up to ``layers.<n>`` (``decoder.layers.3``), else the tensor's module path; its value is
the largest ``max_rel`` / ``dissimilarity`` over all of its compared tensors (all rollouts,
steps and micro-shards), in the order layers are first captured.
"""

from __future__ import annotations

import math
import re
from html import escape

from ftkit.dumps.compare import CompareResult
from ftkit.dumps.layout import KINDS
from ftkit.findings import sort_findings
from ftkit.report.compare_formats import metrics, worst

_LAYER_RE = re.compile(r"^(.*?\blayers\.\d+)(?:\.|#|$)")
_FLOOR, _CEIL = -16, 1  # log10 range of the plot
_W, _H, _PAD_L, _PAD_B, _PAD_T = 960, 320, 56, 110, 16
_CSS = """body{font:14px system-ui,sans-serif;margin:24px;color:#222}h1{font-size:20px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;
font-size:13px}th{background:#f4f4f4}.pass{color:#17803d}.fail{color:#c0262d}.mono{font-family:monospace}
.sev-error{color:#c0262d}.sev-warning{color:#a86b00}svg text{font:11px sans-serif}"""


def layer_of(name: str) -> str:
    m = _LAYER_RE.match(name)
    if m:
        return m.group(1)
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part in KINDS:
            return ".".join(parts[:i]) or "(model)"
    return name


def layer_series(result: CompareResult) -> list[tuple[str, float, float, bool]]:
    """``(layer, max max_rel, max dissimilarity, any failure)`` in first-capture order."""
    layers: dict[str, tuple[float, float, bool]] = {}
    for p in result.pairs:
        if p.metrics is None:
            continue
        rel, dis, failed = layers.get(layer_of(p.name), (0.0, 0.0, False))
        layers[layer_of(p.name)] = (
            max(rel, p.metrics.max_rel),
            max(dis, abs(p.metrics.dissimilarity)),
            failed or p.failed,
        )
    return [(name, rel, dis, failed) for name, (rel, dis, failed) in layers.items()]


def render_html(result: CompareResult, verdict: str, top: int = 50) -> str:
    s = result.stats
    first = result.first_divergence
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>ftkit compare-dumps</title>"
        f"<style>{_CSS}</style></head><body>",
        f"<h1>compare-dumps: <span class='{verdict}'>{verdict.upper()}</span></h1>",
        f"<p class='mono'>{escape(str(result.a))} vs {escape(str(result.b))}<br>{escape(result.kind)}, "
        f"{escape(result.options.describe())}</p>",
        "<table>" + "".join(f"<tr><th>{escape(k)}</th><td>{v}</td></tr>" for k, v in s.items()) + "</table>",
    ]
    if first is not None:
        parts.append(
            f"<h2>First divergence (capture order)</h2><p class='mono'>{escape(first.id)}</p>"
            f"<p>{escape(first.message)}</p>"
        )
    parts.append("<h2>Per-layer divergence</h2>" + _svg(layer_series(result)))
    bad = worst(result, top)
    if bad:
        parts.append(
            "<h2>Worst tensors</h2><table><tr><th>tensor</th><th>status</th><th>max_abs</th><th>max_rel</th>"
            "<th>dissimilarity</th><th>location</th></tr>"
        )
        for p in bad:
            m = metrics(p)
            loc = "-" if m.argmax is None else f"{m.argmax}: {m.a_at:.6g} / {m.b_at:.6g}"
            parts.append(
                f"<tr><td class='mono'>{escape(p.id)}</td><td class='{'fail' if p.failed else 'pass'}'>"
                f"{p.status}</td><td>{m.max_abs:.3g}</td><td>{m.max_rel:.3g}</td>"
                f"<td>{m.dissimilarity:.3g}</td><td class='mono'>{escape(loc)}</td></tr>"
            )
        parts.append("</table>")
    findings = sort_findings(result.findings)
    if findings:
        parts.append("<h2>Findings</h2><table><tr><th>code</th><th>rule</th><th>message</th></tr>")
        parts.extend(
            f"<tr><td class='sev-{f.severity.value}'>{f.code}</td><td>{escape(f.rule)}</td>"
            f"<td class='mono'>{escape(f.message)}</td></tr>"
            for f in findings
        )
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _y(value: float) -> float:
    v = _FLOOR if value <= 0 else min(max(math.log10(value), _FLOOR), _CEIL)
    return _PAD_T + (_CEIL - v) / (_CEIL - _FLOOR) * (_H - _PAD_T - _PAD_B)


def _svg(series: list[tuple[str, float, float, bool]]) -> str:
    if not series:
        return "<p>No compared tensors.</p>"
    n = len(series)
    step = (_W - _PAD_L - 16) / max(n - 1, 1)
    xs = [_PAD_L + i * step for i in range(n)]
    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{_W}' height='{_H}' role='img' "
        f"aria-label='per-layer divergence'>"
    ]
    for e in range(_FLOOR, _CEIL + 1, 2):
        y = _y(10.0**e)
        out.append(
            f"<line x1='{_PAD_L}' x2='{_W - 8}' y1='{y:.1f}' y2='{y:.1f}' stroke='#eee'/>"
            f"<text x='{_PAD_L - 6}' y='{y + 4:.1f}' text-anchor='end'>1e{e}</text>"
        )
    curves = (([r[1] for r in series], "#1f6feb", "max_rel"), ([r[2] for r in series], "#8250df", "dissimilarity"))
    for values, color, label in curves:
        pts = " ".join(f"{x:.1f},{_y(v):.1f}" for x, v in zip(xs, values))
        out.append(f"<polyline fill='none' stroke='{color}' stroke-width='1.5' points='{pts}'/>")
        for x, v, row in zip(xs, values, series):
            fill = "#c0262d" if row[3] else color
            out.append(
                f"<circle cx='{x:.1f}' cy='{_y(v):.1f}' r='3' fill='{fill}'><title>"
                f"{escape(row[0])}: {label} {v:.3g}</title></circle>"
            )
    every = max(1, math.ceil(n / 40))
    for i in range(0, n, every):
        out.append(
            f"<text transform='translate({xs[i]:.1f},{_H - _PAD_B + 8}) rotate(60)'>{escape(series[i][0][-40:])}</text>"
        )
    out.append(
        f"<text x='{_PAD_L}' y='{_H - 4}'>blue: max_rel, purple: dissimilarity, red points: failing layer; "
        f"values at or below 1e{_FLOOR} (equal) sit on the floor</text></svg>"
    )
    return "".join(out)
