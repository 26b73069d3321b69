"""``ftkit compare-runs`` on synthetic run logs (``ftkit.testing.synthetic``: the same seed gives the
same fingerprints whatever the cells and faults): equal runs, planted divergences of each kind at a
chosen step, damaged input (exit 2), a merged log, a prefix, the output formats and the codes table."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ftkit import cli
from ftkit.runs.codes import TABLE
from ftkit.runs.configs import config_diff
from ftkit.runs.matcher import KEEP, Matcher
from ftkit.tensors.fingerprint import combine, state_total
from ftkit.testing.synthetic import generate
from ftkit.testing.synthetic_spec import SyntheticSpec

ROOT = Path(__file__).resolve().parents[2]


def _run(path: Path, **kw: object) -> Path:
    spec = SyntheticSpec(**{"cells": 2, "faults": 0, "tensors": 6, "rollouts": 3, "engines": 1, **kw})  # type: ignore[arg-type]
    generate(path, spec)
    return path


@pytest.fixture(scope="module")
def ref(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(tmp_path_factory.mktemp("ref") / "ref")


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _rewrite(run: Path, edit) -> None:  # noqa: ANN001 - edit(event) -> None changes it in place
    for path in sorted((run / "events").glob("*.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        for ev in lines:
            edit(ev)
        path.write_text("".join(json.dumps(ev) + "\n" for ev in lines))


def _compare(a: Path | str, b: Path | str, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict, str]:
    code = cli.main(["compare-runs", str(a), str(b), "--format", "json", *args])
    out = capsys.readouterr()
    return code, (json.loads(out.out) if out.out.strip() else {}), out.err


def test_a_faulted_four_cell_run_equals_a_two_cell_one(ref: Path, tmp_path: Path, capsys) -> None:
    other = _run(tmp_path / "four", cells=4, faults=1)
    code, doc, _ = _compare(other, ref, capsys)
    assert code == 0 and doc["verdict"] == "pass" and doc["first_divergence"] is None
    assert doc["steps"] == {"a": 12, "b": 12, "common": 12, "differ": 0, "only_a": 0, "only_b": 0}
    assert doc["strip"] == [{"from": 0, "to": 11, "status": "equal", "count": 12}]
    assert doc["config_diff"] == [{"field": "cells", "a": 4, "b": 2, "kind": "neutral"}]
    assert doc["schema_version"] and {f["code"] for f in doc["findings"]} == {"CR007"}


def test_a_state_change_at_step_5_is_the_first_divergence_with_its_tensor(ref: Path, tmp_path: Path, capsys) -> None:
    b = _copy(ref, tmp_path / "b")
    names: list[str] = []

    def edit(ev: dict) -> None:
        if ev["type"] == "state_fingerprint" and ev["step"] >= 5:
            name = sorted(ev["params"])[0]
            names.append(name)
            ev["params"][name] = "0" * 32
            ev["total"] = state_total(ev["params"], ev["optimizer"])

    _rewrite(b, edit)
    code, doc, _ = _compare(ref, b, capsys)
    assert code == 1 and doc["verdict"] == "fail"
    first = doc["first_divergence"]
    assert (first["step"], first["rollout"], first["what"], first["tensor"]) == (5, 1, "state", names[0])
    assert first["differing_steps"] == 7 and first["common_steps_from"] == 7
    assert doc["strip"] == [
        {"from": 0, "to": 4, "status": "equal", "count": 5},
        {"from": 5, "to": 11, "status": "differs", "count": 7},
    ]
    (cr001,) = [f for f in doc["findings"] if f["code"] == "CR001"]
    assert cr001["evidence"]["step"] == 5 and cr001["evidence"]["count"] == 7


def test_a_one_ulp_metric_differs_exactly_and_passes_with_a_tolerance(ref: Path, tmp_path: Path, capsys) -> None:
    b = _copy(ref, tmp_path / "b")
    import math

    def edit(ev: dict) -> None:
        if ev["type"] == "metric" and ev["step"] == 3:
            name = next(n for n in ev["values"] if isinstance(ev["values"][n], float))
            ev["values"][name] = math.nextafter(ev["values"][name], math.inf)

    _rewrite(b, edit)
    code, doc, _ = _compare(ref, b, capsys)
    assert code == 1 and (doc["first_divergence"]["step"], doc["first_divergence"]["what"]) == (3, "metric")
    code, doc, _ = _compare(ref, b, capsys, "--rtol", "1e-9")
    assert code == 0 and doc["mode"].startswith("rtol")


def test_other_samples_trained_is_a_witness_divergence_before_the_state(ref: Path, tmp_path: Path, capsys) -> None:
    b = _copy(ref, tmp_path / "b")

    def edit(ev: dict) -> None:
        if ev["type"] == "witness_counts" and ev["step"] == 2:
            ev["counts"][0] = 2
        if ev["type"] == "state_fingerprint" and ev["step"] == 2:
            name = sorted(ev["params"])[-1]
            ev["params"][name] = "1" * 32
            ev["total"] = state_total(ev["params"], ev["optimizer"])

    _rewrite(b, edit)
    code, doc, _ = _compare(ref, b, capsys)
    first = doc["first_divergence"]
    assert code == 1 and (first["step"], first["what"], first["also"]) == (2, "witness", ["state"])
    assert "counted differently (1 vs 2)" in first["message"]


def test_weights_sent_differ_for_a_version(ref: Path, tmp_path: Path, capsys) -> None:
    b = _copy(ref, tmp_path / "b")
    names: list[str] = []

    def edit(ev: dict) -> None:
        if ev["type"] in ("weights_sent", "engine_weights") and ev["version"] == 2:
            names.append(sorted(ev["params"])[1])
            ev["params"][names[-1]] = "2" * 32
            ev["total"] = combine(ev["params"])

    _rewrite(b, edit)
    code, doc, _ = _compare(ref, b, capsys)
    first = doc["first_divergence"]
    assert code == 1 and (first["what"], first["rollout"], first["step"], first["version"]) == ("weights", 2, 8, 2)
    assert first["tensor"] == names[0]


@pytest.mark.parametrize("damage", ["cut", "gap", "tampered"])
def test_damaged_input_is_exit_2_with_one_line(ref: Path, tmp_path: Path, capsys, damage: str) -> None:
    b = _copy(ref, tmp_path / "b")
    trainer = sorted((b / "events").glob("trainer-*.jsonl"))[0]
    lines = trainer.read_text().splitlines(keepends=True)
    if damage == "cut":
        trainer.write_text("".join(lines[: len(lines) // 2]))
    elif damage == "gap":
        trainer.write_text("".join(lines[:3] + lines[4:]))
    else:
        fp = next(i for i, line in enumerate(lines) if '"state_fingerprint"' in line)
        ev = json.loads(lines[fp])
        ev["total"] = "f" * 32  # the total its per-tensor entries contradict: a forged line
        lines[fp] = json.dumps(ev) + "\n"
        trainer.write_text("".join(lines))
    for a, b_ in ((ref, b), (b, ref)):
        code, doc, err = _compare(a, b_, capsys)
        assert code == 2 and doc == {}
        assert err.startswith("Error: ") and "cannot be compared: its log is damaged: FT111" in err
        assert "Traceback" not in err and "analyze-events" in err


def test_a_merged_log_compares_with_a_run_directory(ref: Path, tmp_path: Path, capsys) -> None:
    from ftkit.events.merge import write_merged_log

    other = _run(tmp_path / "three", cells=3, faults=1)
    merged = tmp_path / "merged.jsonl.gz"
    write_merged_log(other / "events", merged)
    code, doc, _ = _compare(merged, ref, capsys)
    assert code == 0 and doc["steps"]["common"] == 12


def test_a_prefix_is_compared_and_reported(ref: Path, tmp_path: Path, capsys) -> None:
    short = _run(tmp_path / "short", rollouts=2)
    code, doc, _ = _compare(ref, short, capsys)
    assert code == 0 and doc["steps"]["only_a"] == 4
    (cr006,) = [f for f in doc["findings"] if f["code"] == "CR006"]
    assert cr006["severity"] == "warning" and "A committed 4 step(s) the other did not (8-11)" in cr006["message"]
    code, doc, _ = _compare(ref, short, capsys, "--require-same-length")
    assert code == 1 and [f["severity"] for f in doc["findings"] if f["code"] == "CR006"] == ["error"]


def test_human_github_junit_and_html(ref: Path, tmp_path: Path, capsys) -> None:
    other = _run(tmp_path / "seed", seed=1)
    junit, html = tmp_path / "r.xml", tmp_path / "r.html"
    code = cli.main(["compare-runs", str(ref), str(other), "--junit-xml", str(junit), "--html", str(html)])
    out = capsys.readouterr().out
    assert code == 1
    assert out.splitlines()[0].startswith("the runs' configs differ in what determines the result: seed")
    assert "FAIL first divergence at step 0 (rollout 0)" in out
    assert "CR001" in junit.read_text() and "first divergence: step 0" in html.read_text()
    code = cli.main(["compare-runs", str(ref), str(other), "--format", "github"])
    out = capsys.readouterr().out
    assert code == 1 and out.startswith("::error") and "ftkit compare-runs" in out


def test_usage_errors_are_exit_2(ref: Path, tmp_path: Path, capsys) -> None:
    assert cli.main(["compare-runs", str(ref), str(tmp_path / "nope")]) == 2
    assert "Error: " in capsys.readouterr().err
    assert cli.main(["compare-runs", str(ref), str(ref), "--rtol", "-1"]) == 2
    assert cli.main(["compare-runs", "-", "-"]) == 2
    capsys.readouterr()


def test_matcher_keeps_detail_only_for_the_first_differing_items_and_retracts() -> None:
    m = Matcher()
    for step in range(3 * KEEP):
        m.put(0, ("state", step), (0, step, 2), "a", {"x": step})
        m.put(1, ("state", step), (0, step, 2), "b" if step % 2 else "a", {"x": step})
    assert len(m.details) == 2 * KEEP
    assert m.detail(("state", 1), 0) == {"x": 1} and m.detail(("state", 0), 0) is None
    m.step(0, 4, 0)
    m.step(0, 9, 1)
    m.retract(0, 4, 0)
    assert m.entries[("state", 3)][1] == "a" and m.entries[("state", 9)][1] is None
    assert set(m.steps[0]) == {4}


def test_config_diff_lists_what_determines_the_result_first() -> None:
    rows = config_diff(
        {"lr": 1, "cells": 1, "out": "a", "zeta": 1, "seed": 0}, {"lr": 2, "cells": 3, "out": "b", "zeta": 2, "seed": 1}
    )
    assert [(r["field"], r["kind"]) for r in rows] == [
        ("seed", "result"),
        ("lr", "result"),
        ("zeta", "result"),
        ("cells", "neutral"),
        ("out", "neutral"),
    ]


def test_the_codes_table_is_documented() -> None:
    doc = (ROOT / "docs" / "compare-runs.md").read_text()
    assert TABLE.markdown() in doc, "regenerate the table with ftkit.runs.codes.TABLE.markdown()"


def test_runs_of_two_fingerprint_schemes_compare_everything_but_fingerprints(ref: Path, tmp_path: Path, capsys) -> None:
    """A run logged before ftkit-fp2 (no ``fingerprint_scheme``: ftkit-fp1) against one of this
    version: equal values would give other digests, so state and weights are not compared
    (a note says why), and a change in them is not reported as a divergence."""
    b = _copy(ref, tmp_path / "b")

    def edit(ev: dict) -> None:
        if ev["type"] == "run_started":
            assert ev["fingerprint_scheme"] == "ftkit-fp2"  # what this version writes
            del ev["fingerprint_scheme"]
        if ev["type"] == "weights_sent" and ev["version"] == 2:  # another scheme: other digests
            ev["params"] = {n: "3" * 32 for n in ev["params"]}
            ev["total"] = combine(ev["params"])

    _rewrite(b, edit)
    code, doc, _ = _compare(ref, b, capsys)
    assert code == 0 and doc["verdict"] == "pass" and doc["first_divergence"] is None
    assert any("A computes them as ftkit-fp2, B as ftkit-fp1" in n for n in doc["notes"])
