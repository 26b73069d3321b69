"""Output CI can trust: hostile text in findings cannot forge GitHub annotations, break the
step summary's tables, the JUnit XML or the JSON, or reach the terminal as control sequences."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from junit_schemas import check_junit

from ftkit.findings import Finding, RuleSummary, Severity
from ftkit.report import escaping, github, junit

FORGED = "w\n::error file=README.md::x"
HOSTILE = FORGED + "\r\n::warning::y %0A, a:b | <script>alert(1)</script> \x1b[31mred\x1b[0m \x07\x00\x9b2J ]]> &amp;"


def _finding(message: str = HOSTILE, **evidence: object) -> Finding:
    return Finding(code="CD001", rule="value-mismatch", severity=Severity.error, message=message, evidence=evidence)


def test_a_forged_tensor_name_does_not_forge_an_annotation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GITHUB_WORKSPACE", str(tmp_path))
    text = github.workflow_commands(
        [_finding(f"tensor {FORGED} differs", file=str(tmp_path / "a,b:c.jsonl"), line=3)],
        "ftkit compare-dumps",
        f"fail: first divergence {FORGED}",
        failed=True,
    )
    lines = text.splitlines()
    assert len(lines) == 2  # one annotation, one verdict line: nothing injected a line of its own
    assert all(line.startswith(("::error ", "::warning ", "::notice ")) for line in lines)
    assert not any(line.startswith("::error file=README.md") for line in lines)
    assert "w%0A::error file=README.md::x differs" in lines[0]  # inert inside the message
    assert lines[0].startswith("::error file=a%2Cb%3Ac.jsonl,line=3,title=CD001 value-mismatch::")
    assert lines[1] == "::error title=ftkit compare-dumps::fail: first divergence w%0A::error file=README.md::x"


@given(st.text())
@settings(max_examples=300, deadline=None)
def test_any_text_stays_on_one_annotation_line(text: str) -> None:
    line = github.annotation(_finding(text, file=text, line=1), root="/")
    assert "\n" not in line and "\r" not in line
    props = line[2:].split("::", 1)[0]  # "error file=...,line=1,title=..."
    assert props.count("::") == 0 and len(props.split(",")) <= 3


def test_file_is_relative_to_the_workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    (repo / "runs" / "events").mkdir(parents=True)
    monkeypatch.setenv("GITHUB_WORKSPACE", str(repo))
    monkeypatch.chdir(tmp_path)
    inside = github.annotation(_finding("m", file="repo/runs/events/x.jsonl", line=4))
    assert inside.startswith("::error file=runs/events/x.jsonl,line=4,title=")
    outside = github.annotation(_finding("m", file="/elsewhere/x.jsonl", line=4))
    assert "file=" not in outside and outside.endswith("::/elsewhere/x.jsonl:4: m")
    monkeypatch.delenv("GITHUB_WORKSPACE")
    monkeypatch.chdir(repo)
    assert github.annotation(_finding("m", file=str(repo / "runs/events/x.jsonl"))).startswith(
        "::error file=runs/events/x.jsonl,title="
    )


def test_annotations_are_capped_with_a_count_of_the_rest() -> None:
    findings = [_finding(f"finding {i}") for i in range(30)]
    lines = github.workflow_commands(findings, "ftkit analyze-events", "FAIL: 30", failed=True).splitlines()
    assert len(lines) == github.MAX_ANNOTATIONS
    assert [line.split("::")[2].split("%0A")[0] for line in lines[:8]] == [f"finding {i}" for i in range(8)]
    assert lines[8].startswith("::warning ") and "22 more finding(s) not annotated" in lines[8]
    assert lines[9] == "::error title=ftkit analyze-events::FAIL: 30"
    few = github.workflow_commands(findings[:9], "t", "s", failed=False).splitlines()
    assert len(few) == 10 and few[-1] == "::notice title=t::s"


def test_step_summary_cells_are_escaped() -> None:
    table = github.markdown_table(["tensor", "message"], [[FORGED, HOSTILE]])
    rows = table.splitlines()
    assert len(rows) == 3  # header, rule, one row: no newline ended the row
    row = rows[2]
    assert row.count(" | ") == 1 and row.startswith("| ") and row.endswith(" |")  # no cell split by "|"
    assert "<script>" not in row and "&lt;script&gt;" in row and "\x1b" not in row
    assert "\\[" not in escaping.md_cell("a") and escaping.md_cell("[x](http://e)") == "\\[x\\]\\(http://e\\)"


def test_strict_json_parses_in_node_and_jq(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ftkit.report.sink import Format, Output

    Output(Format.json).json({"values": [1.0, float("nan"), float("inf"), -float("inf")], "name": HOSTILE})
    text = capsys.readouterr().out
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in the JSON"))
    assert doc["values"] == [1.0, "NaN", "Infinity", "-Infinity"] and doc["name"] == HOSTILE
    path = tmp_path / "doc.json"
    path.write_text(text)
    for tool, argv in (
        (
            "node",
            [
                "node",
                "-e",
                "const d = JSON.parse(require('fs').readFileSync(process.argv[1])); console.log(d.values[1])",
            ],
        ),
        ("jq", ["jq", "-r", ".values[1]"]),
    ):
        exe = shutil.which(tool)
        assert exe, f"{tool} is needed (scripts/setup.sh installs it)"
        proc = subprocess.run([*argv, str(path)], capture_output=True, text=True)
        assert proc.returncode == 0 and proc.stdout.strip() == "NaN", (tool, proc.stderr)


def test_junit_is_well_formed_for_any_name(tmp_path: Path) -> None:
    every_control = "".join(chr(c) for c in range(0x20)) + "\x7f\x85\ud800\udfff\ufffe\uffff"
    name = f"t{every_control}{HOSTILE}"
    cases = junit.rule_cases(
        "ftkit.x" + every_control,
        [RuleSummary(code="CD001", rule=name, severity=Severity.error)],
        [_finding(name, tensor=name, file=name)],
    )
    cases.append(junit.Case(name, name, [junit.Failure(name, name, name)]))
    path = tmp_path / "r.xml"
    junit.write_junit(path, "ftkit.x", cases)
    root = check_junit(path)
    failure = root.find("testsuite/testcase/failure")
    assert failure is not None
    message = failure.get("message") or ""
    assert "\\x1b[31mred" in message and "\\x00" in message and "\\ud800" in message and "<script>" in message


@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=())))
@settings(max_examples=200, deadline=None)
def test_junit_any_unicode_text(text: str) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "r.xml"
        junit.write_junit(path, text, [junit.Case(text, text, [junit.Failure(text, text, text)])])
        check_junit(path)


def test_terminal_escaping_keeps_text_and_shows_controls() -> None:
    assert escaping.terminal("a\x1b[31mb\tc\nd\u202e") == "a\\x1b[31mb\tc\nd\\u202e"
    assert escaping.terminal("plain é 名") == "plain é 名"


def test_one_line_and_literal_keep_names_on_their_line() -> None:
    assert escaping.one_line("a\n::error::x\r\tb\x1b") == "a\\n::error::x\\x0d\\tb\\x1b"
    assert escaping.literal("[bold]x[/bold] :warning:") == "\\[bold]x\\[/bold] :warning:"
