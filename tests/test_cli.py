"""The CLI contract of DESIGN.md section 6: exit codes, error lines, --version, --debug."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer

from ftkit import __version__, cli
from ftkit.errors import InputError


def test_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"ftkit {__version__}"


def test_no_arguments_prints_help_and_exits_2(capsys):
    assert cli.main([]) == 2
    assert "Usage" in capsys.readouterr().out


def test_unknown_option_is_one_error_line_and_exit_2(capsys):
    assert cli.main(["--no-such-option"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Error: No such option: --no-such-option")
    assert "Traceback" not in err


@pytest.fixture
def failing_app(monkeypatch):
    app = typer.Typer()
    app.callback()(cli.root)  # the real root options (--debug, --version)

    @app.command()
    def crash() -> None:
        raise RuntimeError("boom")

    @app.command()
    def bad_input() -> None:
        raise InputError("events.jsonl is not readable", "check the path")

    monkeypatch.setattr(cli, "app", app)
    return app


def test_uncaught_exception_is_internal_error_3(failing_app, capsys):
    assert cli.main(["crash"]) == 3
    err = capsys.readouterr().err
    assert "Error: internal error: RuntimeError: boom" in err
    assert "Traceback" not in err


def test_debug_shows_traceback(failing_app, capsys):
    assert cli.main(["--debug", "crash"]) == 3
    assert "Traceback" in capsys.readouterr().err


def test_domain_error_is_exit_2_with_hint(failing_app, capsys):
    assert cli.main(["bad-input"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["Error: events.jsonl is not readable", "Hint: check the path"]


def test_console_script_exit_code_and_streams():
    proc = subprocess.run([sys.executable, "-m", "ftkit", "--bogus"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("Error: No such option")
