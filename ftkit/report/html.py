"""Self-contained HTML report of ``ftkit compare-dumps --html FILE``: a divergence heatmap.

Top to bottom: the verdict, the summary counts and the differences between the two runs'
``run.json`` (looked up at, or above, each compared path); the first divergence; the
**heatmap**; the worst tensors (tensor, status, metrics, worst element and both values);
the findings, collapsed and searchable (at most ``MAX_ROWS`` rows).

Heatmap (model: ``ftkit.report.heatmap``): one row per layer in model order, one column per
capture group in capture order; a cell's colour is ``log10`` of its largest metric (grey:
bitwise equal, black: a tensor missing or of another shape or dtype, a whole column of black:
a rollout or file one side lacks, white: nothing captured there); failing cells are outlined
red, the first divergence outlined black and labelled. A selector switches the metric
(``max_rel``, ``max_abs``, ``dissimilarity``); hovering a cell names its worst tensor, worst
element and both values (from a compact JSON block; the worst-tensor table has the same
without a script).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

from ftkit.dumps.compare import CompareResult
from ftkit.report.compare_rank import ordered_findings, worst
from ftkit.report.heatmap import METRICS, Cell, Heatmap, heatmap, missing_wholes
from ftkit.report.html_page import finding_list, kv, legend, num, page, table

_CELL_H, _LABEL_W, _HEAD_H, _RIGHT = 16, 230, 96, 130
# viridis, sampled at 9 points (value 0 = smallest log10, 1 = largest)
_PALETTE = ("#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725")
_EQUAL, _BROKEN = "#e6e8eb", "#1f2328"


def _colour(v: float, lo: float, hi: float) -> str:
    if v <= 0:
        return _EQUAL
    x = (min(max(math.log10(v) if math.isfinite(v) else hi, lo), hi) - lo) / (hi - lo)
    return _PALETTE[round(x * (len(_PALETTE) - 1))]


def _range(cells: Sequence[Cell], i: int) -> tuple[float, float]:
    logs = [math.log10(c.values[i]) for c in cells if 0 < c.values[i] < math.inf]
    if not logs:
        return (-16.0, 0.0)
    lo, hi = math.floor(max(min(logs), -20)), math.ceil(max(logs))
    return (float(lo), float(max(hi, lo + 1)))


def _svg(hm: Heatmap) -> tuple[str, str]:
    """The heatmap SVG and its hover data (JSON: row and column labels, metric ranges, and per
    drawn cell, in drawing order, ``[row, col, [max_rel, max_abs, dissimilarity] (null:
    infinite), tensors, worst tensor (relative to the row), status, worst element]``)."""
    nr, nc = len(hm.rows), len(hm.cols)
    cw = max(13, min(40, 720 // max(nc, 1)))  # cell width: wide for few columns, never below a label's height
    w, h = _LABEL_W + nc * cw + _RIGHT, _HEAD_H + nr * _CELL_H + 4
    ranges = [_range(list(hm.cells.values()), i) for i in range(len(METRICS))]
    out = [
        f"<svg id='heat' xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' role='img' "
        "aria-label='divergence heatmap'>"
    ]
    for r, label in enumerate(hm.rows):  # every row and column labelled: cells are larger than the font
        y = _HEAD_H + r * _CELL_H + _CELL_H - 3
        out.append(
            f"<text x='{_LABEL_W - 6}' y='{y}' text-anchor='end'>{escape(_clip(label, 36))}"
            f"<title>{escape(label)}</title></text>"
        )
    for c, label in enumerate(hm.cols):
        x = _LABEL_W + c * cw + cw / 2
        out.append(
            f"<text transform='translate({x + 4:.1f},{_HEAD_H - 4}) rotate(-90)'>{escape(_clip(_col(label), 15))}"
            f"<title>{escape(label)}</title></text>"
        )
    out.append(
        f"<rect x='{_LABEL_W}' y='{_HEAD_H}' width='{nc * cw}' height='{nr * _CELL_H}' fill='#fff' stroke='#d8dee4'/>"
    )
    first_xy: tuple[int, int] | None = None
    tips: list[list[Any]] = []
    for (r, c), cell in sorted(hm.cells.items()):
        x, y = _LABEL_W + c * cw, _HEAD_H + r * _CELL_H
        fill = _BROKEN if cell.broken else _colour(cell.values[0], *ranges[0])
        cls = "c" + (" f" if cell.failed else "") + (" b" if cell.broken else "")
        out.append(f"<rect class='{cls}' x='{x}' y='{y}' width='{cw - 1}' height='{_CELL_H - 1}' fill='{fill}'/>")
        tips.append(_tip(hm, r, c, cell))
        if cell.first and first_xy is None:
            first_xy = (x, y)
    if first_xy is not None:
        fx, fy = first_xy
        right = _LABEL_W + nc * cw
        out.append(
            f"<rect id='first-divergence' x='{fx - 2}' y='{fy - 2}' width='{cw + 3}' height='{_CELL_H + 3}' "
            "fill='none' stroke='#000' stroke-width='2.5'/>"
            f"<line x1='{fx + cw + 2}' x2='{right + 4}' y1='{fy + _CELL_H / 2}' y2='{fy + _CELL_H / 2}' stroke='#000' "
            f"stroke-dasharray='2 2'/><text x='{right + 8}' y='{fy + _CELL_H - 4}' font-weight='700'>first divergence"
            "</text>"
        )
    out.append("</svg>")
    data = {"rows": hm.rows, "cols": hm.cols, "ranges": ranges, "cells": tips}
    return "".join(out), json.dumps(data, separators=(",", ":")).replace("</", "<\\/")


def _col(group: str) -> str:
    """Short column label: ``actor/fwd_bwd/rollout_000003/step000004/ms003`` -> ``r3 s4 ms3``;
    a whole rollout one side lacks, ``.../rollout_000003 (missing in B)`` -> ``r3 not in B``."""
    lacking = re.fullmatch(r"(.*) \(missing in (\w+)\)", group)
    if lacking:
        whole = re.search(r"rollout_(\d+)$", lacking.group(1))
        return f"{f'r{int(whole.group(1))}' if whole else lacking.group(1)} not in {lacking.group(2)}"
    m = re.search(r"rollout_(\d+)/step(\d+)(?:/ms(\d+))?", group)
    if not m:
        return group
    label = f"r{int(m.group(1))} s{int(m.group(2))}"
    return label + (f" ms{int(m.group(3))}" if m.group(3) is not None else " repl")


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else "\u2026" + text[-(n - 1) :]


def _tip(hm: Heatmap, r: int, c: int, cell: Cell) -> list[Any]:
    """One cell's hover data (see ``_svg``)."""
    values = [float(f"{v:.3g}") if math.isfinite(v) else None for v in cell.values]
    p = next((w for w in cell.worst if w is not None and w.failed), None) or cell.worst[0]
    if p is None:
        why = None
        if cell.broken:
            why = "missing, shape or dtype mismatch" if cell.tensors else "not captured on this side at all"
        return [r, c, values, cell.tensors, None, why, None]
    name = p.name[len(hm.rows[r]) + 1 :] if p.name.startswith(hm.rows[r] + ".") else p.name
    m = p.metrics
    if m is None:
        return [r, c, values, cell.tensors, name, p.status, p.message or None]
    where = None if m.argmax is None else f"{m.argmax}: A={m.a_at:.7g} B={m.b_at:.7g}"
    return [r, c, values, cell.tensors, name, p.status, where]


def find_run_json(path: Path) -> Path | None:
    """``run.json`` at ``path`` or in one of its four nearest parents (a run's sub-path)."""
    here = path if path.is_dir() else path.parent
    for d in [here, *here.parents][:5]:
        if (d / "run.json").is_file():
            return d / "run.json"
    return None


def config_diff(a: Path, b: Path) -> tuple[list[tuple[str, str, str]], str | None]:
    """Differing leaves of the two runs' ``run.json`` (``created`` and ``run`` left out) and a
    note when either is absent or unreadable."""
    docs = []
    for side, path in (("A", a), ("B", b)):
        found = find_run_json(path)
        if found is None:
            return [], f"no run.json at or above {side} ({path}); configurations not compared"
        try:
            docs.append(_flatten(json.loads(found.read_text(encoding="utf-8"))))
        except (OSError, ValueError) as exc:
            return [], f"{found}: unreadable ({exc}); configurations not compared"
    fa, fb = docs
    keys = sorted((fa.keys() | fb.keys()) - {"created", "run", "config.out"})
    return [(k, fa.get(k, "(absent)"), fb.get(k, "(absent)")) for k in keys if fa.get(k) != fb.get(k)], None


def _flatten(doc: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(doc, dict):
        out: dict[str, str] = {}
        for k, v in doc.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): json.dumps(doc)}


_HEAT_JS = (
    f"var HEAT_PALETTE={json.dumps(list(_PALETTE))},HEAT_EQUAL='{_EQUAL}';"
    + """
(function(){var svg=document.getElementById('heat'),el=document.getElementById('heat-data');if(!svg||!el){return;}
var D=JSON.parse(el.textContent),rects=svg.querySelectorAll('rect.c'),tip=document.getElementById('heat-tip');
var names=['max_rel','max_abs','dissimilarity'];
function fmt(v){return v===null?'inf':String(v);}
function text(i){var d=D.cells[i],s=D.rows[d[0]]+' @ '+D.cols[d[1]]+': '+d[3]+' tensor(s); '+
  names.map(function(n,k){return n+' '+fmt(d[2][k]);}).join(', ');
  if(d[4]!==null){s+='; worst '+D.rows[d[0]]+'.'+d[4]+' ('+d[5]+')';}else if(d[5]){s+='; '+d[5];}
  if(d[6]){s+='; worst element '+d[6];}return s;}
for(var k=0;k<rects.length;k++){rects[k].__i=k;}
svg.addEventListener('mousemove',function(e){var i=e.target.__i;if(i===undefined){tip.style.display='none';return;}
  tip.textContent=text(i);tip.style.display='block';tip.style.left=(e.pageX+14)+'px';tip.style.top=(e.pageY+14)+'px';});
svg.addEventListener('mouseleave',function(){tip.style.display='none';});
var sel=document.getElementById('metric');
sel.addEventListener('change',function(){var i=sel.selectedIndex,lo=D.ranges[i][0],hi=D.ranges[i][1],pal=HEAT_PALETTE;
  for(var k=0;k<rects.length;k++){var r=rects[k];if(r.classList.contains('b')){continue;}
    var v=D.cells[k][2][i],c=HEAT_EQUAL;if(v===null||v>0){var l=v===null?hi:Math.log10(v);
    var x=(Math.min(Math.max(l,lo),hi)-lo)/(hi-lo);c=pal[Math.round(x*(pal.length-1))];}r.setAttribute('fill',c);}
  document.getElementById('scale-lo').textContent='1e'+lo;document.getElementById('scale-hi').textContent='1e'+hi;});
})();
"""
)
_HEAT_CSS = (
    "<style>#heat rect.f{stroke:#cf222e;stroke-width:1.5}#heat-tip{position:absolute;display:none;max-width:560px;"
    "background:#fff;border:1px solid #8c959f;padding:4px 8px;font:12px ui-monospace,monospace;"
    "box-shadow:0 2px 6px #0003;pointer-events:none;z-index:9}</style>"
)


def render_html(result: CompareResult, verdict: str, base: Path | None, top: int = 50) -> str:
    """The whole page (``verdict``: ``pass`` / ``fail`` for the command's ``--fail-on``); links
    to the inputs are relative to ``base`` (``html_page.where_link``)."""
    s = result.stats
    first = result.first_divergence
    diffs, note = config_diff(result.a, result.b)
    counts = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in s.items() if v and k not in ("tensors", "bytes"))
    body = [
        f"<h1>compare-dumps: <span class='{verdict}'>{verdict.upper()}</span></h1>",
        kv(
            [
                ("A", f"<span class='mono'>{escape(str(result.a))}</span>"),
                ("B (reference)", f"<span class='mono'>{escape(str(result.b))}</span>"),
                ("compared", escape(f"{result.kind}, {result.options.describe()}")),
                ("tensors", escape(f"{s.get('tensors', 0)} ({counts or 'none'}), {s.get('bytes', 0)} bytes read")),
            ]
        ),
        "<h2>Configuration differences (run.json)</h2>",
        f"<p class='muted'>{escape(note)}</p>"
        if note
        else (
            table(("key", "A", "B"), [(f"<code>{escape(k)}</code>", escape(x), escape(y)) for k, x, y in diffs])
            if diffs
            else "<p>The two runs' run.json agree (apart from name and creation time).</p>"
        ),
        "<h2>First divergence (capture order)</h2>",
        f"<p class='mono'>{escape(first.id)}</p><p>{escape(first.message)}</p>"
        if first
        else "<p class='pass'>None: every compared tensor passed.</p>",
        "<h2>Divergence heatmap</h2>",
        _heat_section(result),
        "<h2>Worst tensors</h2>",
        _worst(result, top),
        "<h2>Findings</h2>",
        finding_list(ordered_findings(result), "findings", base),
    ]
    return page("ftkit compare-dumps", body, _HEAT_JS)


def _heat_section(result: CompareResult) -> str:
    if not result.pairs and not missing_wholes(result):
        return "<p>No compared tensors.</p>"
    hm = heatmap(result)
    lo, hi = _range(list(hm.cells.values()), 0)
    options = "".join(f"<option>{m}</option>" for m in METRICS)
    scale = "".join(f"<i class='swatch' style='background:{c};margin:0'></i>" for c in _PALETTE)
    svg, data = _svg(hm)
    return (
        _HEAT_CSS + f"<p><label>colour: log10 of <select id='metric'>{options}</select></label> &nbsp; "
        f"<span id='scale-lo'>1e{lo:.0f}</span> {scale} <span id='scale-hi'>1e{hi:.0f}</span></p>"
        + legend([("bitwise equal", _EQUAL), ("missing / shape / dtype", _BROKEN), ("nothing captured", "#fff")])
        + "<p class='muted'>Rows: layers in model order; columns: rollout (r), step (s), micro-shard (ms) or "
        "replicated state (repl) in capture order. Red outline: failing cell. Hover a cell for its worst tensor.</p>"
        + f"<div class='scroll'>{svg}</div><div id='heat-tip' role='tooltip'></div>"
        + f"<script type='application/json' id='heat-data'>{data}</script>"
    )


def _worst(result: CompareResult, top: int) -> str:
    bad = worst(result, top)
    if not bad:
        return "<p>No tensor differs.</p>"
    rows = []
    for p in bad:
        m = p.metrics
        assert m is not None
        loc = "-" if m.argmax is None else f"{m.argmax}: A={m.a_at!r} B={m.b_at!r}"
        rows.append(
            (
                f"<span class='mono'>{escape(p.id)}</span>",
                f"<span class='{'fail' if p.failed else 'pass'}'>{escape(p.status)}</span>",
                num(m.max_abs),
                num(m.max_rel),
                num(m.dissimilarity),
                f"<span class='mono'>{escape(loc)}</span>",
            )
        )
    header = ("tensor", "status", "max_abs", "max_rel", "dissimilarity", "worst element: values")
    return (
        "<details open><summary>the most different tensors</summary>"
        "<input class='search' type='search' placeholder='filter tensors' data-filter='worst'>"
        + table(header, rows, "worst")
        + "</details>"
    )
