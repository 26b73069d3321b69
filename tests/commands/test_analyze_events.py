"""``ftkit analyze-events`` / ``ftkit analyze`` through the CLI: every exit code and format,
JUnit, GitHub step summary, rule selection, corrupt inputs (never exit 3), a real subprocess."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from ftkit import cli
from ftkit.analysis.registry import all_rules
from ftkit.testing.synthetic import generate
from ftkit.testing.synthetic_spec import SyntheticSpec


@pytest.fixture(scope="module")
def clean_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("clean")
    generate(d, SyntheticSpec(cells=3, engines=1, rollouts=2, steps_per_rollout=2, samples_per_rollout=8, faults=1))
    return d / "events"


@pytest.fixture(scope="module")
def bad_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    generate(
        d, SyntheticSpec(cells=3, engines=1, rollouts=2, steps_per_rollout=2, samples_per_rollout=8, violation="FT104")
    )
    return d / "events"


def _run(capsys, *args):
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_clean_human(capsys, clean_dir):
    code, out, err = _run(capsys, "analyze-events", str(clean_dir))
    assert code == 0
    for text in ("Rules", "FT101", "replica-divergence", "Recovery", "PASS", "Run synthetic"):
        assert text in out
    assert "Traceback" not in err


def test_alias_analyze(capsys, clean_dir):
    assert _run(capsys, "analyze", str(clean_dir))[0] == 0


def test_findings_exit_1_in_every_format(capsys, bad_dir, tmp_path, monkeypatch):
    code, out, _ = _run(capsys, "analyze-events", str(bad_dir))
    assert code == 1 and "FT104" in out and "FAIL" in out

    code, out, err = _run(capsys, "analyze-events", str(bad_dir), "--format", "json")
    doc = json.loads(out)
    assert code == 1 and doc["schema_version"] == 1 and doc["verdict"] == "fail"
    (finding,) = doc["findings"]
    assert set(finding) == {"code", "rule", "severity", "message", "evidence", "fix"}
    # the how-to-fix line travels with the finding, in the words for the log's producer (ftkit train)
    assert finding["fix"].startswith("samples were trained twice") and "micro-shards overlap" in finding["fix"]
    assert finding["fix"] != all_rules()["FT104"].fix  # the table's covers every producer
    assert finding["code"] == "FT104" and finding["evidence"]["rollout"] >= 0
    assert {r["code"] for r in doc["rules"]} >= {"FT101", "FT113"} and doc["stats"]["events"] > 0
    assert "recovery" in doc

    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.setenv("GITHUB_WORKSPACE", str(bad_dir.parent))
    code, out, _ = _run(capsys, "analyze-events", str(bad_dir), "--format", "github")
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith("::error file=events/") and "title=FT104 witness-duplicate" in lines[0]
    assert lines[-1].startswith("::error title=ftkit analyze-events::FAIL")
    assert "## ftkit analyze-events: FAIL" in summary.read_text() and "| FT104 |" in summary.read_text()


def test_fail_on(capsys, bad_dir, tmp_path):
    assert _run(capsys, "analyze-events", str(bad_dir), "--fail-on", "never")[0] == 0
    # a warning-only log: the truncated last line
    d = tmp_path / "w"
    generate(d, SyntheticSpec(cells=2, engines=0, rollouts=1, faults=0))
    with open(d / "events" / "trainer-c0-r0-i0.jsonl", "ab") as fh:
        fh.write(b'{"schema": 1, "ty')
    assert _run(capsys, "analyze-events", str(d), "--fail-on", "error")[0] == 0
    code, out, _ = _run(capsys, "analyze-events", str(d), "--fail-on", "warning", "-f", "json")
    assert code == 1 and json.loads(out)["findings"][0]["severity"] == "warning"


def test_junit_one_case_per_rule(capsys, bad_dir, tmp_path):
    xml = tmp_path / "out.xml"
    code, _, _ = _run(capsys, "analyze-events", str(bad_dir), "--junit-xml", str(xml), "-f", "json")
    assert code == 1
    cases = ET.parse(xml).getroot().findall(".//testcase")
    assert len(cases) == len(all_rules())
    failed = [c.get("name") for c in cases if c.find("failure") is not None]
    assert failed == ["FT104 witness-duplicate"]


def test_rule_and_skip_rule(capsys, bad_dir):
    code, out, _ = _run(capsys, "analyze-events", str(bad_dir), "--skip-rule", "FT104", "-f", "json")
    assert code == 0 and "FT104" not in {r["code"] for r in json.loads(out)["rules"]}
    code, out, _ = _run(capsys, "analyze-events", str(bad_dir), "--rule", "FT101", "--rule", "FT104", "-f", "json")
    assert code == 1 and [r["code"] for r in json.loads(out)["rules"]] == ["FT101", "FT104", "FT106", "FT111", "FT112"]


@pytest.mark.parametrize(
    "args", [["--rule", "FT999"], ["--skip-rule", "nope"], ["--format", "xml"], ["--fail-on", "sometimes"]]
)
def test_bad_usage_exit_2(capsys, clean_dir, args):
    code, out, err = _run(capsys, "analyze-events", str(clean_dir), *args)
    assert code == 2 and out == "" and err.startswith("Error:")


def test_unreadable_input_exit_2(capsys, tmp_path):
    code, out, err = _run(capsys, "analyze-events", str(tmp_path / "missing"))
    assert code == 2 and out == "" and "Error:" in err and "Hint:" in err and "Traceback" not in err
    (tmp_path / "empty").mkdir()
    assert _run(capsys, "analyze-events", str(tmp_path / "empty"))[0] == 2
    assert _run(capsys, "analyze-events")[0] == 2


CORRUPT = {
    "garbage.jsonl": os.urandom(50_000),
    "empty.jsonl": b"",
    "huge.jsonl": b'{"x": "' + b"a" * (17 << 20) + b'"}\n{"schema": 1}\n',
    "nul.jsonl": b"\x00" * 10_000 + b"\n",
    "deep.jsonl": b"[" * 200_000 + b"\n",
    "numbers.jsonl": b'1\n2e999999\n-Infinity\n"str"\n',
    "cut.jsonl.gz": gzip.compress(b'{"schema": 1, "type": "metric"}\n' * 1000)[:300],
    "fake.jsonl.gz": b"\x1f\x8b not really gzip",
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(CORRUPT))
def test_corrupt_inputs_give_findings_never_exit_3(capsys, tmp_path, name):
    (tmp_path / name).write_bytes(CORRUPT[name])
    code, out, err = _run(capsys, "analyze-events", str(tmp_path / name), "-f", "json")
    assert code == 1, err
    assert json.loads(out)["verdict"] == "fail" and "Traceback" not in err


def test_mixed_directory_with_gz_and_other_files(capsys, clean_dir, tmp_path):
    d = tmp_path / "mixed"
    shutil.copytree(clean_dir, d / "events")
    for p in list((d / "events").glob("trainer-c1-*.jsonl")):
        p.with_name(p.name + ".gz").write_bytes(gzip.compress(p.read_bytes()))
        p.unlink()
    (d / "events" / "README.txt").write_text("ignored")
    (d / "run.json").write_text("{}")
    code, out, _ = _run(capsys, "analyze-events", str(d), "-f", "json")
    assert code == 0 and json.loads(out)["stats"]["files"] == len(list(clean_dir.iterdir()))


def test_stdout_is_data_only_warnings_on_stderr(capsys, clean_dir, tmp_path):
    d = tmp_path / "u"
    shutil.copytree(clean_dir, d)
    with open(d / "driver-i0.jsonl", "a") as fh:
        fh.write('{"type": "from_the_future"}\n')
    code, out, err = _run(capsys, "analyze-events", str(d), "-f", "json")
    assert code == 0 and json.loads(out)["stats"]["unknown_types"] == {"from_the_future": 1}
    assert "from_the_future" in err


def test_real_subprocess(clean_dir, bad_dir):
    env = {**os.environ, "FTKIT_PROGRESS": "1"}
    ok = subprocess.run(
        [sys.executable, "-m", "ftkit", "analyze", str(clean_dir), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert ok.returncode == 0 and json.loads(ok.stdout)["verdict"] == "pass"
    bad = subprocess.run(
        [sys.executable, "-m", "ftkit", "analyze-events", str(bad_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert bad.returncode == 1 and "FT104" in bad.stdout and "Traceback" not in bad.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--rule", "FT101", "--skip-rule", "FT101"],
        [arg for code in all_rules() for arg in ("--skip-rule", code.lower())],
    ],
)
def test_a_selection_that_selects_nothing_is_exit_2(capsys, clean_dir, tmp_path, args):
    """Checking nothing is never a pass (issue 24 item 3): no empty table, no PASS, no JUnit."""
    junit = tmp_path / "r.xml"
    code, out, err = _run(capsys, "analyze-events", str(clean_dir), *args, "--junit-xml", str(junit))
    assert code == 2 and out == "" and not junit.exists()
    assert err.startswith("Error: the rule selection leaves no rule") and "Hint:" in err


def test_a_rule_that_checked_nothing_is_not_run_in_every_format(capsys, tmp_path, monkeypatch):
    """No faults, so no heals: FT107 (heal-unverified) has nothing to check; it is "not run"
    (JUnit skipped), never passed, in JSON, human, GitHub, JUnit and HTML."""
    generate(
        tmp_path, SyntheticSpec(cells=2, engines=1, rollouts=2, steps_per_rollout=2, samples_per_rollout=8, faults=0)
    )
    events, junit, html = str(tmp_path / "events"), tmp_path / "r.xml", tmp_path / "r.html"
    code, out, _ = _run(capsys, "analyze-events", events, "-f", "json", "--junit-xml", str(junit), "--html", str(html))
    status = {r["code"]: (r["checked"], r["status"]) for r in json.loads(out)["rules"]}
    not_run = sorted(code for code, (checked, _) in status.items() if checked == 0)
    assert code == 0 and status["FT107"] == (0, "not run") and len(not_run) < len(status)
    assert all(s == ("not run" if code in not_run else "passed") for code, (_, s) in status.items())
    suite = ET.parse(junit).getroot().find("testsuite")
    skipped = {tc.get("name").split()[0] for tc in suite.iter("testcase") if tc.find("skipped") is not None}
    assert sorted(skipped) == not_run and suite.get("skipped") == str(len(not_run))
    assert html.read_text().count(">not run<") == len(not_run)
    code, out, _ = _run(capsys, "analyze-events", events)
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("│ FT1")}
    assert all(("not run" in row) == (code in not_run) for code, row in rows.items())
    assert f"{len(not_run)} rule(s) not run (checked nothing): {', '.join(not_run)}" in out
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code, out, _ = _run(capsys, "analyze-events", events, "-f", "github")
    assert f"not run (checked nothing): {', '.join(not_run)}" in out
    assert r"| FT107 | heal\-unverified | error | 0 | 0 | not run |" in summary.read_text()


def test_counts_in_the_summary_are_worded_for_one(capsys, tmp_path):
    generate(tmp_path, SyntheticSpec(cells=1, engines=1, rollouts=1, steps_per_rollout=2, faults=0))
    code, out, _ = _run(capsys, "analyze-events", str(tmp_path / "events"))
    assert "Run synthetic: 1 cell x tp1 x pp1, 1 engine; " in out and "0 faults, 0 heals" in out
    assert " 1 cells" not in out and " 1 engines" not in out


def test_the_analysis_progress_moves_before_the_end(tmp_path):
    """'Analyzing events' no longer sits at 0% until it jumps to 100% (issue 24 item 6): a log
    of a few hundred lines reports progress on the way."""
    from ftkit.analysis.engine import analyze_paths

    generate(tmp_path, SyntheticSpec(cells=3, engines=1, rollouts=20, steps_per_rollout=2, samples_per_rollout=8))
    seen: list[float] = []
    analyze_paths([tmp_path / "events"], progress=lambda done, total: seen.append(done / total))
    assert seen[-1] == 1.0 and any(s < 1.0 for s in seen), seen
