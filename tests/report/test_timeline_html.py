"""``ftkit analyze-events --html``: the timeline model (``ftkit.analysis.timeline``), its page
(``ftkit.report.timeline_html``) and the CLI option, on synthetic logs with faults and heals."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ftkit import cli
from ftkit.analysis import timeline as tlmod
from ftkit.analysis.timeline import build_timeline
from ftkit.testing.synthetic import generate
from ftkit.testing.synthetic_spec import SyntheticSpec

SPEC = SyntheticSpec(
    cells=3, engines=2, rollouts=3, steps_per_rollout=4, samples_per_rollout=8, faults=2, tensors=6, seed=3
)


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    d = tmp_path_factory.mktemp("faulty")
    run = generate(d, SPEC)
    return run.events_dir, run.fault_steps


def test_lanes_markers_and_steps(faulty: tuple[Path, list[int]]) -> None:
    events, fault_steps = faulty
    tl = build_timeline([events])
    assert tl.run == "synthetic" and tl.status == "completed" and tl.duration > 0
    assert sorted(tl.lanes) == ["cell 0", "cell 1", "cell 2"]
    faults = tl.markers_of("fault")
    assert [m.step for m in faults] == fault_steps
    for m in faults:  # the faulted cell's lane: failed, then restarting, healing and alive again
        states = [iv.state for iv in tl.lanes[m.lane]]
        i = states.index("failed")
        assert states[i : i + 4] == ["failed", "restarting", "healing", "alive"]
    assert all(iv.start <= iv.end for lane in tl.lanes.values() for iv in lane)
    assert [m.lane for m in tl.markers_of("detected")] == [m.lane for m in faults]
    heals = tl.markers_of("heal")
    assert len(heals) == 2 and {m.lane for m in heals} == {m.lane for m in faults}
    assert all("healed from cell 0" in m.label and "MiB" in m.label for m in heals)
    assert [m.label.split(",")[0] for m in tl.markers_of("reconfigure")] == [f"epoch {e}" for e in range(5)]
    assert {m.step for m in tl.markers_of("discarded")} == set(fault_steps)
    assert len(tl.markers_of("engine")) == 2 * SPEC.rollouts and len(tl.markers_of("weights")) == SPEC.rollouts
    assert all(m.file.endswith(".jsonl") and m.line >= 1 for m in tl.markers)
    assert tl.width == 1 and [b.first for b in tl.bins] == list(range(SPEC.steps))
    assert sum(b.committed for b in tl.bins) == SPEC.steps
    assert sum(b.not_committed for b in tl.bins) == len(fault_steps)
    assert tl.metric_names == ["loss", "grad_norm", "reward"]
    assert tl.bins[0].metrics["loss"][1] == pytest.approx(2.5)


def test_dense_runs_aggregate(faulty: tuple[Path, list[int]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Bins double their width instead of growing; routine marks thin out evenly over the run,
    forensic marks over the cap are counted, not drawn."""
    events, fault_steps = faulty
    monkeypatch.setattr(tlmod, "MAX_BINS", 4)
    monkeypatch.setattr(tlmod, "MAX_MARKERS", 2)
    tl = build_timeline([events])
    assert tl.width == 4 and len(tl.bins) == 3
    assert sum(b.steps for b in tl.bins) == SPEC.steps and sum(b.attempts for b in tl.bins) == SPEC.steps + 2
    loss = tl.bins[0].metrics["loss"]
    assert loss[0] == 4 and loss[2] < loss[3]  # count, min < max over the bin's four steps
    engine0 = [m for m in tl.markers_of("engine") if m.lane == "engine 0"]
    assert len(engine0) == 2 and tl.strides["engine@engine 0"] == 2
    assert engine0[-1].label.startswith("loaded version 2")  # the last rollout is still shown
    assert len(tl.markers_of("reconfigure")) == 2 and tl.dropped["marker:reconfigure"] == 3


def test_log_content_never_raises(tmp_path: Path) -> None:
    log = tmp_path / "x.jsonl"
    lines = [
        {"type": "cell_state", "time": 1.0, "cell": 0, "old": "pending", "new": "alive"},
        {"type": "cell_state", "time": 2.0, "cell": "zero"},  # missing and wrong fields
        {"type": "heal", "time": 3.0},
        {"type": "step_outcome", "time": "soon"},
        {"type": "metric", "time": 4.0, "rollout": 0, "step": 0, "values": {"loss": "NaN?", "reward": 1.0}},
        {"type": "step_outcome", "time": 5.0, "rollout": 0, "step": 0, "attempt": 0, "outcome": "committed"},
    ]
    log.write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json\n[1]\n")
    tl = build_timeline([log])
    assert tl.skipped == 3 and tl.events == 5
    assert [iv.state for iv in tl.lanes["cell 0"]] == ["alive"] and tl.bins[0].committed == 1
    assert tl.metric_names == ["reward"]


def test_step_seconds_extend_the_step_back(tmp_path: Path) -> None:
    """Ranks log a step when it ends; the driver's ``step_seconds`` says when it began."""
    outcome = {"type": "step_outcome", "rollout": 0, "attempt": 0, "outcome": "committed"}
    lines = [
        {**outcome, "time": 10.0, "step": 0},
        {"type": "metric", "time": 10.5, "rollout": 0, "step": 0, "values": {"step_seconds": 2.0, "loss": 1.0}},
        {**outcome, "time": 12.0, "step": 1},
    ]
    log = tmp_path / "x.jsonl"
    log.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    tl = build_timeline([log])
    assert [(b.t0, b.t1) for b in tl.bins] == [(8.5, 10.0), (12.0, 12.0)]


def _run(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_writes_page(faulty: tuple[Path, list[int]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events, fault_steps = faulty
    page = tmp_path / "run.html"
    code, out, err = _run(capsys, "analyze-events", events, "--html", page, "--format", "json")
    assert code == 0 and json.loads(out)["verdict"] == "pass" and "HTML report" in err
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert not re.search(r"src\s*=|<link|https?://", text)  # self-contained
    svg = ET.fromstring(re.search(r"<svg viewBox=.*?</svg>", text, re.S).group(0))  # the timeline, well-formed
    classes = [el.get("class", "") for el in svg.iter()]
    assert classes.count("mark-fault") == 2 and classes.count("mark-heal") == 2 and "state-failed" in classes
    for section in ("Timeline", "Metrics by step", "Recovery", "Rules", "Findings", "Timeline events"):
        assert f"<h2>{section}</h2>" in text
    recovery = re.search(r"<table id='recovery'>.*?</table>", text, re.S).group(0)
    assert recovery.count("<tr>") == 1 + len(fault_steps) and "reconfigure" in recovery
    assert text.count("class='chart'") == 3  # reward, loss, grad_norm; each marks the faults (one path)
    paths = re.findall(r"<path class='chart-fault' d='([^']*)'", text)
    assert len(paths) == 3 and all(p.count("M") == len(fault_steps) for p in paths)
    assert "FT113" in text and "driver-i0.jsonl:" in text  # rule table; faults linked to their log line


def test_findings_link_to_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    generate(
        tmp_path, SyntheticSpec(cells=3, rollouts=2, steps_per_rollout=2, samples_per_rollout=8, violation="FT104")
    )
    page = tmp_path / "bad.html"
    code, _, _ = _run(capsys, "analyze-events", tmp_path / "events", "--html", page)
    assert code == 1
    findings = re.search(r"<table id='findings'>.*?</table>", page.read_text(), re.S).group(0)
    assert "FT104" in findings
    # relative to the page (the report and its run move together) with the line's anchor (issue 24 item 10)
    links = re.findall(r"href='([^']+)'[^>]*>[^<]+\.jsonl:(\d+)</a>", findings)
    assert links and all(h.startswith("events/") and h.endswith(f".jsonl#L{n}") for h, n in links)
    assert all((tmp_path / h.split("#")[0]).is_file() for h, _ in links)


def test_a_page_on_a_special_file_links_absolutely(tmp_path: Path) -> None:
    from ftkit.report.html_page import page_dir, where_link

    assert page_dir(Path("/dev/null")) is None
    assert where_link(str(tmp_path / "a b.jsonl"), 3, None) == (
        f"<a class='mono' href='{(tmp_path / 'a b.jsonl').as_uri()}#L3'>a b.jsonl:3</a>"
    )
    assert "href='../a%20b.jsonl'" in where_link(str(tmp_path / "a b.jsonl"), None, page_dir(tmp_path / "r" / "x.html"))


@pytest.mark.parametrize("target", ["missing/r.html", "."])
def test_bad_target_is_exit_2_before_work(
    faulty: tuple[Path, list[int]], tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    code, out, err = _run(capsys, "analyze-events", faulty[0], "--html", tmp_path / target)
    assert code == 2 and out == "" and err.startswith("Error:") and "Hint:" in err and "Traceback" not in err
    assert not (tmp_path / "missing").exists()


@pytest.mark.slow
def test_real_train_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The timeline of a real ``ftkit train`` run (Ray actors, megatron-core ranks, one engine)."""
    out = tmp_path / "run"
    args = ["--rollouts", "2", "--steps-per-rollout", "1", "--samples-per-rollout", "8", "--micro-shards", "2"]
    proc = subprocess.run(
        [sys.executable, "-m", "ftkit", "train", "--out", str(out), *args, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    tl = build_timeline([out / "events"])
    assert tl.run == "run" and tl.status == "completed"
    for lane in ("cell 0", "cell 1"):
        assert [iv.state for iv in tl.lanes[lane]] == ["starting", "alive", "stopped"]
    assert [m.label.split(" (")[0] for m in tl.markers_of("engine")] == [f"loaded version {v}" for v in range(3)]
    assert len(tl.markers_of("weights")) == 3 and len(tl.markers_of("reconfigure")) == 1
    assert [(b.first, b.committed, b.not_committed) for b in tl.bins] == [(0, 1, 0), (1, 1, 0)]
    assert {"loss", "grad_norm", "tokens_per_s", "reward"} <= set(tl.metric_names)
    page = tmp_path / "run.html"
    assert _run(capsys, "analyze-events", out, "--html", page)[0] == 0
    text = page.read_text()
    assert all(f"data-metric='{m}'" in text for m in ("reward", "loss", "grad_norm", "tokens_per_s"))


def test_one_colour_one_meaning() -> None:
    """Issue 24 item 7: a colour on the timeline means one thing. The only shared colours are a
    state and the mark of the same event (failed / failure detected, healing / heal), committed
    steps with alive cells, and the two ends of a weight transfer (one legend entry)."""
    from ftkit.report.metric_charts import DISCARDED, FAULT
    from ftkit.report.timeline_html import COMMITTED, MARK_STYLE, NOT_COMMITTED, STATE_COLORS

    meanings: dict[str, set[str]] = {}
    for state, colour in STATE_COLORS.items():
        meanings.setdefault(colour, set()).add(state)
    for colour, _, _, text in MARK_STYLE.values():
        meanings.setdefault(colour, set()).add(text)
    shared = {frozenset(m) for m in meanings.values() if len(m) > 1}
    assert shared == {frozenset({"failed", "failure detected"}), frozenset({"healing", "heal"})}
    assert STATE_COLORS["alive"] == COMMITTED and MARK_STYLE["discarded"][0] == NOT_COMMITTED
    assert (MARK_STYLE["fault"][0], MARK_STYLE["discarded"][0]) == (FAULT, DISCARDED)


def test_findings_are_drawn_at_their_step(tmp_path: Path) -> None:
    """A FAIL run shows its finding on the steps lane, at the step the evidence names."""
    from ftkit.analysis.engine import analyze_paths
    from ftkit.report.timeline_html import render_timeline_html, with_findings

    events = generate(tmp_path, SyntheticSpec(cells=2, engines=1, rollouts=2, steps_per_rollout=2, violation="FT106"))
    result = analyze_paths([events.events_dir])
    tl = build_timeline([events.events_dir])
    steps = {f.evidence.get("step") for f in result.findings} - {None}
    marks = with_findings(tl, result).markers_of("finding")
    assert steps and {m.step for m in marks} == steps and all(m.lane == "steps" for m in marks)
    assert render_timeline_html(tl, result, "fail", None).count("class='mark-finding'") == len(marks)


def test_a_long_start_up_is_compressed_so_training_fills_the_width(tmp_path: Path) -> None:
    """Issue 24 item 7: Ray and megatron starting took 43 of 51 s; the timeline opens on the
    training span (the start-up shaded in the first 8%), not with faults squeezed to one edge."""
    from ftkit.analysis.engine import analyze_paths
    from ftkit.report.timeline_html import _W, STARTUP_SHARE, render_timeline_html, time_axis

    events = generate(tmp_path, SPEC).events_dir
    short = build_timeline([events])
    assert time_axis(short)[1] == short.start  # a short start-up: the axis stays linear
    driver = events / "driver-i0.jsonl"
    lines = [json.loads(line) for line in driver.read_text().splitlines()]
    lines[0]["time"] -= 5 * short.duration  # the run started long before its first step
    driver.write_text("".join(json.dumps(ev) + "\n" for ev in lines))
    tl = build_timeline([events])
    x, t_train = time_axis(tl)
    assert t_train > tl.start and x(t_train) == pytest.approx(_W * STARTUP_SHARE) and x(tl.end) == _W
    page = render_timeline_html(tl, analyze_paths([events]), "pass", None)
    compressed, linear = page.split("<div id='tl-linear' hidden>")
    steps = [float(v) for v in re.findall(r"class='steps' x='([\d.]+)'", compressed)]
    assert min(steps) >= _W * STARTUP_SHARE - 1 and max(steps) > _W * 0.8
    assert "class='startup'" in compressed and "drawn compressed" in compressed
    # collapsible: the same lanes on a linear axis, one checkbox away (start-up to scale)
    assert "id='startup-scale'" in compressed and "class='startup'" not in linear
    to_scale = [float(v) for v in re.findall(r"class='steps' x='([\d.]+)'", linear)]
    assert len(to_scale) == len(steps) and min(to_scale) > _W * 0.8  # training is the last sixth of the run


def test_the_log_prob_section_shows_where_a_mismatch_sits(tmp_path: Path) -> None:
    from ftkit.analysis.engine import analyze_paths
    from ftkit.report.timeline_html import write_report

    run = generate(tmp_path, SyntheticSpec(cells=2, engines=1, faults=0, tensors=4, violation="FT114"))
    tl = build_timeline([run.events_dir])
    view = tl.logprobs
    bad = [key for key, t in view.steps.items() if t.differing]
    assert len(bad) == 1 and bad[0][1] % SyntheticSpec().steps_per_rollout == 0  # one rollout's first step
    assert [k for k, t in sorted(view.positions.items()) if t.differing] == [2]  # the synthetic mismatch position
    assert all(c.compared() == (1, 0, 0.0) for v, c in view.canaries.items() if c.trainer is not None)
    result = analyze_paths([run.events_dir])
    page = tmp_path / "r.html"
    write_report(page, [run.events_dir], result, result.verdict())
    text = re.sub(r"<[^>]+>", " ", page.read_text())
    assert "By response position (0: the first response token)" in text and "Canary set, per weights version" in text
    assert "<span class='fail'>1</span>" in page.read_text()
