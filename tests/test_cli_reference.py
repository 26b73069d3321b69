"""Generated references (docs/cli.md, docs/exit-codes.md, docs/event-schema.md, completions/)
must match the code; the completion scripts must be valid for their shells."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import cli_reference  # noqa: E402  (a development script, not part of the package)


def test_generated_files_are_fresh():
    stale = cli_reference.stale()
    assert not stale, f"stale generated files {stale}: run `python scripts/cli_reference.py`"


def test_every_command_is_documented_and_completed():
    _, commands = cli_reference.collect()
    cli_md = cli_reference.render_cli_md()
    bash = cli_reference.artefacts()[Path("completions/ftkit.bash")]
    for c in commands:
        assert f"## `ftkit {c.name}`" in cli_md
        assert c.name in bash
        for o in c.options:
            assert o.names[0] in bash


def test_stale_file_is_detected(tmp_path):
    for rel, text in cli_reference.artefacts().items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert cli_reference.stale(tmp_path) == []
    (tmp_path / "completions/ftkit.bash").write_text("# edited by hand\n")
    assert [str(p) for p in cli_reference.stale(tmp_path)] == ["completions/ftkit.bash"]


@pytest.mark.parametrize("shell,name", [("bash", "ftkit.bash"), ("zsh", "ftkit.zsh"), ("fish", "ftkit.fish")])
def test_completion_script_parses(shell, name):
    exe = shutil.which(shell)
    assert exe, f"{shell} is needed to check the completion script (.ci/run installs it)"
    proc = subprocess.run([exe, "-n", str(cli_reference.ROOT / "completions" / name)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_bash_completion_offers_commands():
    _, commands = cli_reference.collect()
    script = cli_reference.ROOT / "completions" / "ftkit.bash"
    proc = subprocess.run(
        [
            "bash",
            "-c",
            f'source "{script}"; COMP_WORDS=(ftkit ""); COMP_CWORD=1; _ftkit; printf "%s\\n" "${{COMPREPLY[@]}}"',
        ],
        capture_output=True,
        text=True,
    )
    offered = set(proc.stdout.split())
    assert {c.name for c in commands} <= offered
    assert "--version" in offered
