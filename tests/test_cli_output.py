"""End to end through the ``ftkit`` console entry point: hostile tensor names and non-finite
values in real safetensors files reach every output format safely, and report paths are
checked before any work."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

ROOT = Path(__file__).resolve().parent.parent
FORGED = "w\n::error file=README.md::x"
ESCAPES = "\x1b[31mred\x1b]0;title\x07|<b>"


def _ftkit(*args: object, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ftkit", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), "GITHUB_WORKSPACE": str(cwd), **env},
        timeout=300,
    )


@pytest.fixture()
def hostile(tmp_path: Path) -> Path:
    a = {FORGED: np.array([1.0, 2.0], np.float32), ESCAPES: np.array([1.0, np.nan, np.inf], np.float32)}
    b = {FORGED: np.array([1.0, 3.0], np.float32), ESCAPES: np.array([1.0, 2.0, -np.inf], np.float32)}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    save_file(a, str(tmp_path / "a" / "t.safetensors"))
    save_file(b, str(tmp_path / "b" / "t.safetensors"))
    return tmp_path


def test_github_format_with_hostile_names(hostile: Path) -> None:
    summary = hostile / "summary.md"
    proc = _ftkit("compare-dumps", "a", "b", "--format", "github", cwd=hostile, GITHUB_STEP_SUMMARY=str(summary))
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines and all(line.startswith(("::error ", "::warning ", "::notice ")) for line in lines)
    assert not any(line.startswith("::error file=README.md") for line in lines)
    assert lines[-1].startswith("::error title=ftkit compare-dumps::fail")
    md = summary.read_text()
    assert "\x1b" not in md and "<b>" not in md
    for row in (r for r in md.splitlines() if r.startswith("| ")):
        assert row.endswith(" |")


def test_json_is_strict_with_nan_and_inf(hostile: Path) -> None:
    proc = _ftkit("compare-dumps", "a", "b", "--format", "json", cwd=hostile)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout, parse_constant=lambda c: pytest.fail(f"bare {c}"))
    assert {t["name"] for t in doc["tensors"]} == {FORGED, ESCAPES}
    node = shutil.which("node")
    assert node, "node is needed (scripts/setup.sh installs it)"
    parsed = subprocess.run(
        [node, "-e", "let s='';process.stdin.on('data',d=>s+=d).on('end',()=>console.log(JSON.parse(s).verdict))"],
        input=proc.stdout,
        capture_output=True,
        text=True,
    )
    assert parsed.returncode == 0 and parsed.stdout.strip() == "fail", parsed.stderr


def test_human_and_junit_with_hostile_names(hostile: Path) -> None:
    junit = hostile / "r.xml"
    proc = _ftkit("compare-dumps", "a", "b", "--junit-xml", junit, cwd=hostile)
    assert proc.returncode == 1, proc.stderr
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout and "\\x1b[31mred" in proc.stdout
    names = {tc.get("name") for tc in ET.parse(junit).getroot().iter("testcase")}
    assert any(n and "::error file=README.md::x" in n for n in names)


@pytest.mark.parametrize("option", ["--junit-xml", "--html"])
def test_report_path_in_a_missing_directory_is_exit_2_before_the_work(hostile: Path, option: str) -> None:
    proc = _ftkit("compare-dumps", "a", "b", option, hostile / "no" / "such" / "r.out", cwd=hostile)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("Error: cannot write") and "does not exist" in proc.stderr
    assert "Hint: " in proc.stderr and "Traceback" not in proc.stderr


def test_report_path_checked_for_analyze_events(tmp_path: Path) -> None:
    proc = _ftkit("analyze-events", tmp_path, "--junit-xml", tmp_path / "missing" / "r.xml", cwd=tmp_path)
    assert proc.returncode == 2 and "Error: cannot write" in proc.stderr and proc.stdout == ""


def _progress_cases(tmp: Path) -> list[tuple[str, list[str]]]:
    from ftkit.testing.synthetic import generate
    from ftkit.testing.synthetic_spec import SyntheticSpec

    generate(tmp / "run", SyntheticSpec(cells=2, engines=1, rollouts=1, steps_per_rollout=2, samples_per_rollout=8))
    return [
        ("Analyzing events", ["analyze-events", str(tmp / "run" / "events")]),
        ("Comparing", ["compare-dumps", "a", "b"]),
        ("Reading dump", ["dump", "a"]),
    ]


def test_progress_is_forced_by_ftkit_progress(hostile: Path) -> None:
    for label, args in _progress_cases(hostile):
        forced = _ftkit(*args, cwd=hostile, FTKIT_PROGRESS="1")
        quiet = _ftkit(*args, cwd=hostile)
        assert label in forced.stderr and label not in forced.stdout, (label, forced.stderr)
        assert label not in quiet.stderr  # stderr is a pipe here: no bar unless forced
        assert forced.stdout == quiet.stdout  # the bar never touches the data


def test_progress_shows_when_stderr_is_a_terminal(hostile: Path) -> None:
    import pty

    for label, args in _progress_cases(hostile):
        master, slave = pty.openpty()
        proc = subprocess.Popen(
            [sys.executable, "-m", "ftkit", *args],
            cwd=hostile,
            stdout=subprocess.PIPE,
            stderr=slave,
            env={**os.environ, "PYTHONPATH": str(ROOT), "FTKIT_PROGRESS": ""},
        )
        os.close(slave)
        seen = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        proc.communicate(timeout=300)
        os.close(master)
        assert label.encode() in seen, (label, seen[-500:])


def test_a_reader_that_stops_early_is_not_an_error(tmp_path: Path) -> None:
    """``ftkit ... --format json | head -c 100``: the closed pipe ends the command quietly."""
    tensors = {f"layer{i}.weight": np.full(4, float(i), np.float32) for i in range(400)}
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
        save_file(tensors, str(tmp_path / side / "t.safetensors"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "ftkit", "compare-dumps", "a", "b", "--format", "json"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None and proc.stderr is not None
    head = proc.stdout.read(100)
    proc.stdout.close()  # the reader goes away with most of the document unread
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0 and head.startswith(b"{")
    assert "Traceback" not in err and "Exception ignored" not in err and "Error" not in err, err


@pytest.mark.parametrize("args", [["--version"], ["compare-dumps", "--help"], ["compare-dumps", "a", "b"]])
@pytest.mark.parametrize("stdout", ["full", "closed"])
def test_a_stdout_that_cannot_take_the_data_is_exit_2(hostile: Path, args: list[str], stdout: str) -> None:
    """A full disk (/dev/full) or a closed fd 1 (``>&-``) loses the output: exit 2 and one line
    that says so, never "a bug in ftkit"; help and --version text included."""
    if stdout == "full" and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    redirect = ">/dev/full" if stdout == "full" else ">&-"
    proc = subprocess.run(
        ["sh", "-c", f'exec "$0" -m ftkit "$@" {redirect}', sys.executable, *args],
        capture_output=False,
        stderr=subprocess.PIPE,
        text=True,
        cwd=hostile,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert lines[0].startswith("Error: cannot write the output to standard output: ")
    assert lines[1].startswith("Hint: ") and "Traceback" not in proc.stderr and "bug" not in proc.stderr
