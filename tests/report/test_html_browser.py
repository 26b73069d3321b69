"""The HTML reports in a real browser: headless Chromium (Debian's ``chromium``; scripts/setup.sh
installs it) loads each report with no console errors, its scripts work (zoom, metric selector,
search boxes), its elements are laid out where a reader needs them, and a screenshot of a known
run shows them (colours of the drawn elements, not pixel-exact).

Console errors are collected by a small harness put in front of the page's own code (``error``
and ``unhandledrejection`` events, ``console.error``/``console.warn``); after ``load`` a check
script writes its findings as JSON into the DOM, which ``--dump-dom`` returns.
"""

from __future__ import annotations

import dataclasses
import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_compare_html import write_run

from ftkit import cli
from ftkit.testing.synthetic import generate
from ftkit.testing.synthetic_spec import SyntheticSpec

HARNESS = """<script>
window.__errors=[];
window.addEventListener('error',function(e){__errors.push('error: '+e.message);});
window.addEventListener('unhandledrejection',function(e){__errors.push('rejection: '+e.reason);});
['error','warn'].forEach(function(k){var f=console[k];console[k]=function(){
  __errors.push('console.'+k+': '+Array.prototype.join.call(arguments,' '));f.apply(console,arguments);};});
</script>"""
CHECK = """<script>
window.addEventListener('load',function(){var r={errors:window.__errors};
try{r.facts=(function(){%s})();}catch(e){r.errors.push('check: '+e);}
var pre=document.createElement('pre');pre.id='__result';pre.textContent=JSON.stringify(r);
document.body.appendChild(pre);});
</script>"""


def _find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        if path := shutil.which(name):
            return path
    return None


@pytest.fixture(scope="session")
def chromium() -> str:
    """The browser; installed with apt-get where possible (as scripts/setup.sh does), else skip."""
    found = _find_chromium()
    if found is None and shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], env=env, capture_output=True, timeout=900)
        found = _find_chromium()
    if found is None:
        pytest.skip(
            "chromium is not installed and cannot be installed here (needs apt-get as root); run scripts/setup.sh"
        )
    return found


def _browser(chromium: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def load(chromium: str, page: Path, check_js: str, tmp: Path, size: str = "1280,1000") -> dict:
    """Load ``page`` (with the harness) in a ``size`` window and return ``{"errors": [...], "facts":
    <check_js's return>}``."""
    text = page.read_text(encoding="utf-8")
    probe = tmp / f"probe-{page.name}"
    probe.write_text(text.replace("<head>", "<head>" + HARNESS, 1).replace("</body>", CHECK % check_js + "</body>", 1))
    res = _browser(chromium, f"--window-size={size}", "--virtual-time-budget=5000", "--dump-dom", probe.as_uri())
    m = re.search(r"<pre id=\"__result\">(.*?)</pre>", res.stdout, re.S)
    assert m, f"no result from the page; chromium said: {res.stderr[-2000:]}"
    return json.loads(html.unescape(m.group(1)))


def screenshot(chromium: str, page: Path, out: Path, height: int) -> Path:
    res = _browser(chromium, f"--window-size=1280,{height}", f"--screenshot={out}", page.as_uri())
    assert out.is_file(), res.stderr[-2000:]
    return out


def colour_share(png: Path, colours: dict[str, str]) -> dict[str, int]:
    """Pixels of each exact colour (``#rrggbb``) in ``png``."""
    from PIL import Image

    counts = Image.open(png).convert("RGB").getcolors(maxcolors=1 << 24) or []
    by_rgb = {rgb: n for n, rgb in counts}
    return {name: by_rgb.get(tuple(int(c[i : i + 2], 16) for i in (1, 3, 5)), 0) for name, c in colours.items()}


@pytest.fixture(scope="module")
def timeline_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tl")
    generate(d, SyntheticSpec(cells=3, engines=2, rollouts=3, steps_per_rollout=4, samples_per_rollout=8, faults=2))
    page = d / "timeline.html"
    assert cli.main(["analyze-events", str(d / "events"), "--html", str(page), "--format", "json"]) == 0
    return page


@pytest.fixture(scope="module")
def heatmap_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("heat")
    write_run(d / "a", diverge_at=None)
    write_run(d / "b", diverge_at=(2, 1), cells=2)
    page = d / "heatmap.html"
    assert cli.main(["compare-dumps", str(d / "a"), str(d / "b"), "--html", str(page), "--format", "json"]) == 1
    return page


def test_harness_reports_errors(chromium: str, tmp_path: Path) -> None:
    """The harness is honest: a page that throws is reported."""
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><head></head><body><script>undefinedThing();</script></body></html>")
    result = load(chromium, page, "return 1;", tmp_path)
    assert result["facts"] == 1 and any("undefinedThing" in e for e in result["errors"])


TIMELINE_CHECK = """
var q=function(s){return document.querySelectorAll(s);}, box=function(e){return e.getBoundingClientRect();};
var svg=document.querySelector('.tl svg'), inner=document.querySelector('.tl-inner'), w0=box(svg).width;
var z=document.getElementById('zoom'); z.value=3; z.dispatchEvent(new Event('input'));
var w1=box(svg).width;
var labs=Array.prototype.map.call(q('.tl .lab div'),function(d){return d.textContent;});
var lanesH=box(svg).height, labDivs=q('.tl .lab div'), misalign=0;
for(var i=0;i<labDivs.length;i++){misalign=Math.max(misalign,
  Math.abs(box(labDivs[i]).top-(box(svg).top+i*lanesH/labDivs.length)));}
var s=document.querySelector('input[data-filter=tl-events]'); s.value='healed from';
s.dispatchEvent(new Event('input'));
var shown=Array.prototype.filter.call(document.getElementById('tl-events').tBodies[0].rows,
  function(r){return r.style.display!=='none';}).length;
return {w0:w0, ratio:w1/w0, zoomText:document.getElementById('zoom-out').textContent, lanes:labs,
  misalign:misalign, charts:q('svg.chart').length, chartW:box(q('svg.chart')[0]).width,
  marks:{fault:q('.mark-fault').length, heal:q('.mark-heal').length, reconfigure:q('.mark-reconfigure').length},
  healRows:shown, recovery:document.getElementById('recovery').tBodies[0].rows.length,
  h2:Array.prototype.map.call(q('h2'),function(h){return h.textContent;})};
"""


def test_timeline_page_in_chromium(chromium: str, timeline_page: Path, tmp_path: Path) -> None:
    result = load(chromium, timeline_page, TIMELINE_CHECK, tmp_path)
    assert result["errors"] == []
    f = result["facts"]
    assert f["w0"] > 900 and f["ratio"] == pytest.approx(8.0, rel=0.01) and f["zoomText"] == "8x"
    assert f["lanes"] == ["driver", "steps", "cell 0", "cell 1", "cell 2", "engine 0", "engine 1"]
    assert f["misalign"] < 1  # each label sits level with its lane
    assert f["charts"] == 3 and f["chartW"] > 400
    assert f["marks"] == {"fault": 2, "heal": 2, "reconfigure": 5}
    assert f["healRows"] == 2 and f["recovery"] == 2
    sections = ["Timeline", "Metrics by step", "Recovery", "Engine vs trainer log-probs", "Rules", "Findings"]
    assert f["h2"][:6] == sections


def test_timeline_screenshot_shows_the_story(chromium: str, timeline_page: Path, tmp_path: Path) -> None:
    from ftkit.report.timeline_html import MARK_STYLE, STATE_COLORS

    png = screenshot(chromium, timeline_page, tmp_path / "timeline.png", 1000)
    share = colour_share(
        png,
        {
            "alive": STATE_COLORS["alive"],
            "failed": STATE_COLORS["failed"],
            "healing": STATE_COLORS["healing"],
            "reconfigure": MARK_STYLE["reconfigure"][0],
            "stopped": STATE_COLORS["stopped"],
        },
    )
    assert share["alive"] > 20_000  # three long lanes of alive cells
    assert all(share[k] > 50 for k in ("failed", "healing", "reconfigure", "stopped")), share


READABLE_CHECK = """
var q=function(s){return document.querySelectorAll(s);}, box=function(e){return e.getBoundingClientRect();};
var titles=Array.prototype.map.call(q('svg.chart text.title'),function(t){return box(t).height;});
var outside=0, small=0;
Array.prototype.forEach.call(q('svg.chart'),function(svg){var sb=box(svg);
  Array.prototype.forEach.call(svg.querySelectorAll('text'),function(t){var b=box(t);
    if(b.left<sb.left-0.5||b.right>sb.right+0.5||b.top<sb.top-0.5||b.bottom>sb.bottom+0.5){outside++;}
    if(b.height<8){small++;}});});
var spans=Array.prototype.filter.call(q('.tl .axis span'),
  function(s){return getComputedStyle(s).display!=='none';}).map(box);
var overlap=0; for(var i=1;i<spans.length;i++){if(spans[i].left<spans[i-1].right){overlap++;}}
return {overflow:document.documentElement.scrollWidth-window.innerWidth, titles:titles, outside:outside,
  small:small, axisOverlap:overlap, findingMarks:q('.mark-finding').length,
  ticks:Array.prototype.map.call(q('svg.chart text[text-anchor=end]'),function(t){return t.textContent;})};
"""


@pytest.mark.parametrize("size", ["1400,1000", "390,844"])
def test_timeline_is_readable_on_a_desktop_and_a_phone(chromium: str, failing_page: Path, tmp_path: Path, size) -> None:
    """Issue 24 item 7: chart titles and ticks readable and inside their charts, round tick values
    (never raw min/mid/max), the page no wider than the window, axis labels apart, and the
    analyzer's finding drawn at its step."""
    result = load(chromium, failing_page, READABLE_CHECK, tmp_path, size)
    assert result["errors"] == []
    f = result["facts"]
    assert f["overflow"] <= 0 and f["outside"] == 0 and f["small"] == 0 and f["axisOverlap"] == 0, f
    assert f["titles"] and min(f["titles"]) >= 11, f["titles"]
    assert f["findingMarks"] >= 1
    assert all(re.fullmatch(r"-?\d+(\.\d{1,2})?[kM]?", t) for t in f["ticks"]), f["ticks"]


@pytest.fixture(scope="module")
def failing_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fail")
    spec = SyntheticSpec(cells=3, engines=2, rollouts=3, steps_per_rollout=4, samples_per_rollout=8, faults=2)
    generate(d, dataclasses.replace(spec, violation="FT106"))
    page = d / "timeline.html"
    assert cli.main(["analyze-events", str(d / "events"), "--html", str(page), "--format", "json"]) == 1
    return page


HEAT_CHECK = """
var svg=document.getElementById('heat'), box=function(e){return e.getBoundingClientRect();};
var cells=svg.querySelectorAll('rect.c'), failing=svg.querySelectorAll('rect.f');
var before=Array.prototype.map.call(cells,function(c){return c.getAttribute('fill');});
var sel=document.getElementById('metric'); sel.selectedIndex=2; sel.dispatchEvent(new Event('change'));
var after=Array.prototype.map.call(cells,function(c){return c.getAttribute('fill');});
var changed=before.filter(function(c,i){return c!==after[i];}).length;
var last=cells[cells.length-1], b=box(last);
last.dispatchEvent(new MouseEvent('mousemove',{bubbles:true,clientX:b.left+2,clientY:b.top+2}));
var tip=document.getElementById('heat-tip'), tipText=tip.textContent, tipShown=getComputedStyle(tip).display;
var texts=Array.prototype.slice.call(svg.querySelectorAll('text'));
var rows=texts.filter(function(t){return t.getAttribute('text-anchor')==='end';}).map(box);
var cols=texts.filter(function(t){return (t.getAttribute('transform')||'').indexOf('rotate')>=0;}).map(box);
var overlapR=0, overlapC=0;
for(var i=1;i<rows.length;i++){if(rows[i].top<rows[i-1].bottom-0.5){overlapR++;}}
for(var j=1;j<cols.length;j++){if(cols[j].left<cols[j-1].right-0.5){overlapC++;}}
var first=box(document.getElementById('first-divergence')), sb=box(svg);
var s=document.querySelector('input[data-filter=findings]'); s.value='step000003/ms001:decoder.layers.3.';
s.dispatchEvent(new Event('input'));
var shown=Array.prototype.filter.call(document.getElementById('findings').tBodies[0].rows,
  function(r){return r.style.display!=='none';}).length;
return {cells:cells.length, failing:failing.length, changed:changed, rows:rows.length, cols:cols.length,
  overlapR:overlapR, overlapC:overlapC, firstInside:first.left>=sb.left&&first.right<=sb.right&&first.width>0,
  rowsLeftOfCells:Math.max.apply(null,rows.map(function(r){return r.right;}))<=box(cells[0]).left,
  scaleLo:document.getElementById('scale-lo').textContent, shown:shown, tip:tipText, tipShown:tipShown};
"""


def test_heatmap_page_in_chromium(chromium: str, heatmap_page: Path, tmp_path: Path) -> None:
    result = load(chromium, heatmap_page, HEAT_CHECK, tmp_path)
    assert result["errors"] == []
    f = result["facts"]
    assert (
        f["cells"] == 6 * 8 and f["failing"] == 3 * 3
    )  # layers 2, 3 and output x the 3 capture groups from step 2 ms 1 on
    assert f["changed"] > 0 and f["scaleLo"].startswith("1e")  # the metric selector recoloured
    assert f["rows"] == 6 and f["cols"] == 8 and f["overlapR"] == 0 and f["overlapC"] == 0
    assert f["firstInside"] and f["rowsLeftOfCells"]
    assert f["shown"] == 2  # the two tensors of layer 3 at step 3, micro-shard 1
    assert f["tipShown"] == "block"  # hovering the last cell (output layer, last capture group) explains it
    assert f["tip"].startswith("output_layer @ actor/fwd_bwd/rollout_000001/step000003/ms001: 1 tensor(s); max_rel ")
    assert "worst output_layer.output (differ); worst element [" in f["tip"] and " B=" in f["tip"]


def test_heatmap_screenshot_shows_the_divergence(chromium: str, heatmap_page: Path, tmp_path: Path) -> None:
    from ftkit.report import html as heat

    png = screenshot(chromium, heatmap_page, tmp_path / "heatmap.png", 1100)
    share = colour_share(png, {"equal": heat._EQUAL, **{f"v{i}": c for i, c in enumerate(heat._PALETTE)}})
    assert share["equal"] > 5_000  # the equal part of the run
    assert sum(1 for k, n in share.items() if k != "equal" and n > 100) >= 2  # diverged cells, several colours


MISSING_CHECK = """
var svg=document.getElementById('heat'), cells=Array.prototype.slice.call(svg.querySelectorAll('rect.c'));
var right=Math.max.apply(null,cells.map(function(c){return c.getBoundingClientRect().left;}));
var col=cells.filter(function(c){return c.getBoundingClientRect().left===right;});
var last=col[col.length-1], b=last.getBoundingClientRect();
last.dispatchEvent(new MouseEvent('mousemove',{bubbles:true,clientX:b.left+2,clientY:b.top+2}));
return {n:col.length, fills:col.map(function(c){return getComputedStyle(c).fill;}),
  visible:col.every(function(c){var r=c.getBoundingClientRect();return r.width>4&&r.height>4;}),
  tip:document.getElementById('heat-tip').textContent};
"""


def test_heatmap_draws_a_missing_rollout_black(chromium: str, tmp_path: Path) -> None:
    """Issue 24 item 7: the legend's black (missing) is on screen for a rollout B lacks: the
    rightmost column, one visible black cell per layer, its tip saying why."""
    import shutil

    write_run(tmp_path / "a", diverge_at=None)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "dumps" / "actor" / "fwd_bwd" / "rollout_000001")
    page = tmp_path / "missing.html"
    assert cli.main(["compare-dumps", str(tmp_path / "a"), str(tmp_path / "b"), "--html", str(page), "-f", "json"]) == 1
    result = load(chromium, page, MISSING_CHECK, tmp_path)
    assert result["errors"] == []
    f = result["facts"]
    assert f["n"] == 6 and f["visible"] and set(f["fills"]) == {"rgb(31, 35, 40)"}  # #1f2328, the legend's black
    assert "rollout_000001 (missing in B): 0 tensor(s)" in f["tip"] and "not captured on this side" in f["tip"]


STARTUP_CHECK = """
var c=document.getElementById('tl-compressed'), l=document.getElementById('tl-linear');
var seen=function(e){return e.getBoundingClientRect().height>0;}, before=[seen(c), seen(l)];
var s=document.getElementById('startup-scale'); s.click();
var after=[seen(c), seen(l)]; s.click();
return {before:before, after:after, back:[seen(c), seen(l)]};
"""


def test_a_compressed_start_up_expands_to_scale(chromium: str, tmp_path: Path) -> None:
    """Issue 24 item 7: the timeline opens on the training span; one click shows the start-up
    to scale, another collapses it again."""
    events = generate(tmp_path, SyntheticSpec(cells=2, engines=1, rollouts=2, steps_per_rollout=2)).events_dir
    driver = events / "driver-i0.jsonl"
    lines = [json.loads(line) for line in driver.read_text().splitlines()]
    lines[0]["time"] -= 5 * (lines[-1]["time"] - lines[0]["time"])  # a long start-up before the first step
    driver.write_text("".join(json.dumps(ev) + "\n" for ev in lines))
    page = tmp_path / "startup.html"
    assert cli.main(["analyze-events", str(events), "--html", str(page), "--format", "json"]) in (0, 1)
    result = load(chromium, page, STARTUP_CHECK, tmp_path)
    assert result["errors"] == []
    f = result["facts"]
    assert f["before"] == [True, False] and f["after"] == [False, True] and f["back"] == [True, False]
