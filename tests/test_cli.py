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


def test_command_names_map_to_the_modules_that_register_them():
    from ftkit.commands import COMMAND_MODULES, COMMAND_NAMES

    cli.register_commands()
    group = typer.main.get_command(cli.app)
    assert set(group.commands) == set(COMMAND_NAMES)  # type: ignore[attr-defined]
    assert set(COMMAND_NAMES.values()) == set(COMMAND_MODULES)


def test_a_forensic_command_imports_only_its_own_command_module(tmp_path):
    """Start-up (issue 10): ``compare-dumps`` does not import train's module (nor its config)."""
    header = b'{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    for name in ("a", "b"):  # two files: compare-dumps refuses one file twice
        (tmp_path / f"{name}.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(8))
    code = (
        "import sys\nfrom ftkit.cli import main\n"
        "code = main(['--debug', 'compare-dumps', sys.argv[1], sys.argv[2]])\n"
        "print(code, sorted(m for m in sys.modules if m.startswith(('ftkit.commands.', 'ftkit.train', 'torch'))))"
    )
    argv = [sys.executable, "-c", code, str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")]
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    last = out.stdout.splitlines()[-1]  # after the command's own report
    assert last == "0 ['ftkit.commands.compare_dumps', 'ftkit.commands.help_style', 'ftkit.commands.options']"


def test_help_after_a_single_command_lists_every_command_in_order(capsys):
    assert cli.main(["dump", "--help"]) == 0
    capsys.readouterr()
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    names = ["train", "dump", "compare-dumps", "analyze-events", "verify-checkpoint"]
    assert all(f" {n} " in out for n in names)
    assert [out.index(f" {n} ") for n in names] == sorted(out.index(f" {n} ") for n in names)
