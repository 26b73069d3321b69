"""The generated completion scripts, exercised by driving real bash, zsh and fish in tmux:
keys are typed (Tab included) and the screen is read back.

Each shell runs in a fresh tmux server (its own socket) inside a directory that holds one
file with a recognisable name: wherever a value is a number, a choice or free text, that
name must never be offered; where a path is expected, it must be.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SENTINEL = "sentinelfile7q.txt"
WAIT_S = 20.0  # upper bound for a shell to react; the tests never measure time
ERRORS = ("_arguments", "invalid option", "command not found", "parse error", "Unknown command", "bad pattern")


class Pane:
    """One shell in a private tmux server."""

    def __init__(self, shell: list[str], cwd: Path) -> None:
        self.socket = f"ftkit-compl-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        env = {**os.environ, "TERM": "xterm-256color", "HOME": str(cwd)}
        subprocess.run(
            ["tmux", "-L", self.socket, "-f", "/dev/null", "new-session", "-d", "-x", "220", "-y", "50", "-c", str(cwd)]
            + shell,
            check=True,
            env=env,
        )
        self.marks = 0

    def keys(self, *keys: str, literal: bool = False) -> None:
        cmd = ["tmux", "-L", self.socket, "send-keys", "-t", "0"] + (["-l"] if literal else []) + list(keys)
        subprocess.run(cmd, check=True)

    def type(self, text: str) -> None:
        self.keys(text, literal=True)

    def screen(self) -> str:
        return subprocess.run(
            ["tmux", "-L", self.socket, "capture-pane", "-p", "-t", "0", "-S", "-200"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    def wait_for(self, text: str, whole_line: bool = False) -> str:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            screen = self.screen()
            if (text in screen.splitlines()) if whole_line else (text in screen):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{text!r} never appeared:\n{self.screen()}")

    def run(self, command: str) -> None:
        """Run ``command`` and wait until it has finished (an echoed mark appears)."""
        self.marks += 1
        mark = f"MARK{self.marks}"
        self.type(f"{command}; echo {mark[:2]}''{mark[2:]}")
        self.keys("Enter")
        self.wait_for(mark, whole_line=True)

    def settled(self) -> str:
        """The screen once it has stopped changing (the shell finished drawing)."""
        last, same = self.screen(), 0
        deadline = time.monotonic() + WAIT_S
        while same < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
            now = self.screen()
            same = same + 1 if now == last else 0
            last = now
        return last

    def complete(self, line: str, tabs: int, expect: tuple[str, ...] = ()) -> str:
        """Type ``line``, press Tab ``tabs`` times, return what the screen shows; clear the line.

        Waits for each of ``expect`` to appear, then for the screen to settle.
        """
        self.run("clear")
        subprocess.run(["tmux", "-L", self.socket, "clear-history", "-t", "0"], check=True)
        self.type(line)
        self.settled()
        for _ in range(tabs):
            self.keys("Tab")
            self.settled()
        for text in expect:
            self.wait_for(text)
        shown = self.settled()
        self.keys("C-c")
        self.run("true")
        for error in ERRORS:
            assert error not in shown, (line, shown)
        return shown

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    (tmp_path / SENTINEL).write_text("x")
    return tmp_path


def _shell(name: str) -> str:
    exe = shutil.which(name)
    if exe is None or shutil.which("tmux") is None:
        pytest.fail(f"{name} and tmux are needed to test the completions (scripts/setup.sh installs them)")
    return exe


@pytest.fixture()
def bash(workdir: Path) -> Iterator[Pane]:
    pane = Pane([_shell("bash"), "--norc", "--noprofile"], workdir)
    try:
        pane.run("PS1='$ '; bind 'set show-all-if-ambiguous on'")
        pane.run(f"source {ROOT / 'completions' / 'ftkit.bash'}")
        yield pane
    finally:
        pane.close()


@pytest.fixture()
def zsh(workdir: Path) -> Iterator[Pane]:
    pane = Pane([_shell("zsh"), "-f"], workdir)
    try:
        pane.run("PS1='%% '; autoload -Uz compinit; compinit -u -D")
        pane.run(f"source {ROOT / 'completions' / 'ftkit.zsh'}")
        yield pane
    finally:
        pane.close()


@pytest.fixture()
def fish(workdir: Path) -> Iterator[Pane]:
    pane = Pane([_shell("fish"), "--no-config"], workdir)
    try:
        pane.run("set -g fish_greeting ''; function fish_prompt; echo '> '; end")
        pane.run(f"source {ROOT / 'completions' / 'ftkit.fish'}")
        yield pane
    finally:
        pane.close()


def _common_cases(pane: Pane, tabs: int) -> None:
    # --model takes a preset or a model directory: both are offered
    pane.complete("ftkit train --model ", tabs, ("tiny", "small", SENTINEL))
    shown = pane.complete("ftkit compare-dumps a b --format ", tabs, ("json", "github"))
    assert SENTINEL not in shown
    for numeric in ("ftkit train --cells ", "ftkit train --lr ", "ftkit compare-dumps a b --rtol "):
        shown = pane.complete(numeric, tabs)
        assert SENTINEL not in shown, (numeric, shown)
    pane.complete("ftkit analyze-events sentin", tabs, (SENTINEL,))  # positional paths do complete
    pane.complete("ftkit train --config sentin", tabs, (SENTINEL,))  # so do path-valued options


def test_bash_completion(bash: Pane) -> None:
    pane = bash
    pane.complete("ftkit ", 2, ("analyze-events", "compare-dumps", "--version"))
    _common_cases(pane, 2)


def test_zsh_completion_has_no_errors(zsh: Pane) -> None:
    zsh.complete("ftkit --", 1, ("--version", "--debug"))
    zsh.complete("ftkit ", 1, ("analyze-events", "compare-dumps"))
    _common_cases(zsh, 1)


def test_fish_completion(fish: Pane) -> None:
    fish.complete("ftkit ", 1, ("analyze-events", "compare-dumps"))
    _common_cases(fish, 1)


def _issue24_cases(pane: Pane, tabs: int) -> None:
    """Rule codes complete for --rule / --skip-rule (issue 24 item 8)."""
    shown = pane.complete("ftkit analyze-events x --rule FT11", tabs, ("FT111", "FT113"))
    assert SENTINEL not in shown and "FT101" not in shown


def test_bash_spaces_equals_and_rule_codes(bash: Pane, workdir: Path) -> None:
    (workdir / "runs" / "quick s").mkdir(parents=True)
    (workdir / "runs" / "quick s" / "run.json").write_text("{}")
    shown = bash.complete("ftkit analyze-events runs/quick\\ s/r", 1, ("run.json",))
    assert "runs/quick\\ s/run.json" in shown and "\\\\" not in shown
    shown = bash.complete("ftkit analyze-events runs/qu", 1, ("quick\\ s",))
    assert "\\\\" not in shown
    shown = bash.complete("ftkit compare-dumps a b --format=", 2, ("json", "github"))
    assert SENTINEL not in shown
    _issue24_cases(bash, 2)


def test_zsh_equals_repeatable_options_and_rule_codes(zsh: Pane) -> None:
    shown = zsh.complete("ftkit compare-dumps a b --format=", 1, ("json", "github"))
    assert SENTINEL not in shown
    zsh.complete("ftkit analyze-events x --rule FT101 --sk", 1, ("--skip-rule",))
    zsh.complete("ftkit analyze-events x --rule FT101 --ru", 1, ("--rule FT101 --rule",))  # offered again
    _issue24_cases(zsh, 1)


def test_fish_rule_codes(fish: Pane) -> None:
    _issue24_cases(fish, 1)
