"""The output sink: stdout carries the command's data only, whatever libraries (Ray included)
and child processes print; human output is not wrapped into files and shows no control text;
progress goes to stderr when forced."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        timeout=300,
    )


def test_guard_moves_everything_else_to_stderr() -> None:
    proc = _python(
        """
        import os, subprocess, sys
        from ftkit.report.sink import Format, Output, guard_stdout
        print("before")
        with guard_stdout():
            out = Output(Format.json)
            print("stray-python")
            sys.stdout.write("stray-sys\\n")
            os.write(1, b"stray-fd\\n")
            subprocess.run(["sh", "-c", "echo stray-child"], check=True)
            out.json({"ok": True})
        print("after")
        """
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "before" and lines[-1] == "after"
    assert json.loads("\n".join(lines[1:-1])) == {"schema_version": 1, "ok": True}
    for stray in ("stray-python", "stray-sys", "stray-fd", "stray-child"):
        assert stray in proc.stderr and stray not in proc.stdout


def test_help_still_goes_to_stdout() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ftkit", "analyze-events", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0 and "--junit-xml" in proc.stdout


def test_human_output_is_not_wrapped_and_shows_no_control_text(capsys: pytest.CaptureFixture[str]) -> None:
    from rich.table import Table

    from ftkit.report.sink import Format, Output

    out = Output(Format.human)
    long = "tensor." + "x" * 400 + " \x1b]0;pwned\x07 \x1b[2J"
    out.out.print(f"first divergence {long}")
    table = Table("tensor", "message")
    table.add_row(long, "m" * 300)
    out.out.print(table)
    out.warn(f"note {long}")
    captured = capsys.readouterr()
    assert "\x1b" not in captured.out and "\x07" not in captured.out and "\x1b" not in captured.err
    first = captured.out.splitlines()[0]
    assert first == "first divergence tensor." + "x" * 400 + " \\x1b]0;pwned\\x07 \\x1b[2J"
    assert any("x" * 400 in line and "m" * 300 in line for line in captured.out.splitlines())  # one table row


def test_progress_is_forced_onto_stderr(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from ftkit.report.sink import Format, Output

    monkeypatch.setenv("FTKIT_PROGRESS", "1")
    out = Output(Format.human)
    with out.progress("Comparing", total=4) as task:
        for _ in range(4):
            task.advance()
    captured = capsys.readouterr()
    assert "Comparing" in captured.err and captured.out == ""
    monkeypatch.delenv("FTKIT_PROGRESS")
    with Output(Format.human).progress("Quiet", total=1) as task:
        task.advance()
    assert "Quiet" not in capsys.readouterr().err  # stderr is not a terminal here


@pytest.mark.slow
def test_nothing_from_ray_reaches_stdout() -> None:
    """A Ray actor prints and its worker process dies: Ray's log monitor and the raylet report
    it ("A worker died ..."), all on stderr; stdout holds the JSON document only."""
    proc = _python(
        """
        import os, time
        import ray
        from ftkit.report.sink import Format, Output, guard_stdout

        with guard_stdout():
            out = Output(Format.json)
            ray.init(address="local", num_cpus=1, include_dashboard=False)

            @ray.remote(max_restarts=0)
            class Doomed:
                def speak(self):
                    print("actor-says-hello", flush=True)
                    return os.getpid()

                def die(self):
                    os._exit(1)

            actor = Doomed.remote()
            ray.get(actor.speak.remote())
            try:
                ray.get(actor.die.remote())
            except Exception as exc:
                print("driver-saw", type(exc).__name__)
            time.sleep(3)  # let the log monitor forward what the worker and the raylet wrote
            ray.shutdown()
            out.json({"ok": True})
        """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == {"schema_version": 1, "ok": True}
    assert "actor-says-hello" in proc.stderr and "driver-saw" in proc.stderr


def test_info_with_broken_markup_prints_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    from ftkit.report.sink import Format, Output

    Output(Format.human).info("training -> runs/a[/b]c")
    assert "runs/a[/b]c" in capsys.readouterr().err


def test_plain_progress_lines_for_a_log(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24 item 6: on a stderr that is not a terminal (a CI log) long work shows plain
    periodic lines, short work nothing, FTKIT_PROGRESS=0 nothing at all."""
    from ftkit.report.sink import Format, Output, PlainProgress

    now = [0.0]
    lines: list[str] = []
    task = PlainProgress(lines.append, "Analyzing events", None, every=10, clock=lambda: now[0])
    task.update(completed=500)  # before the first period: quiet
    now[0] = 10.0
    task.update(completed=1000, total=4000)
    now[0] = 15.0
    task.advance(1000)  # within the period: quiet
    now[0] = 21.0
    task.advance(1000)
    task.close()
    assert lines == [
        "Analyzing events: 1,000 of 4,000 (25%), 10 s",
        "Analyzing events: 3,000 of 4,000 (75%), 21 s",
        "Analyzing events: done, 21 s",
    ]
    quick: list[str] = []
    short = PlainProgress(quick.append, "Comparing", 2, clock=lambda: 0.0)
    short.advance()
    short.close()
    assert quick == []

    monkeypatch.delenv("FTKIT_PROGRESS", raising=False)
    with Output(Format.human).progress("Reading", total=None) as plain:
        assert isinstance(plain, PlainProgress)  # stderr is captured, not a terminal
    monkeypatch.setenv("FTKIT_PROGRESS", "0")
    with Output(Format.human).progress("Reading", total=None) as off:
        assert not isinstance(off, PlainProgress)
    with Output(Format.json).progress("Reading", total=None) as machine:
        monkeypatch.delenv("FTKIT_PROGRESS")
        assert not isinstance(machine, PlainProgress)
    assert capsys.readouterr().err == ""
