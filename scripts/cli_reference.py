"""Reference artefacts generated from the CLI itself, so they cannot drift from the code.

A development script (not part of the installed package). ``python scripts/cli_reference.py``
(re)writes:

- ``docs/cli.md``            every command, its arguments and options (from the Typer app)
- ``docs/exit-codes.md``     the exit-code contract (from ``ftkit.cli``)
- ``docs/event-schema.md``   the event log schema (from ``ftkit.events.schema``), when present
- ``completions/ftkit.bash``, ``ftkit.zsh``, ``ftkit.fish``  static completion scripts
  (rendered by ``scripts/completions.py``)

``--check`` writes nothing and exits 1 listing the stale files; the test suite runs it.
Completion scripts are static (commands, options and choices are baked in), so completing
never starts Python.
"""

from __future__ import annotations

import argparse
import enum
import importlib.util
import pathlib
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer.core
import typer.main

sys.path.insert(0, str(Path(__file__).resolve().parent))
from completions import render_bash, render_fish, render_zsh  # noqa: E402
from ftkit import cli  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
COMMAND = "python scripts/cli_reference.py"


@dataclass
class Opt:
    """One option or argument. ``kind`` says what its value is, for completion: ``flag`` (no
    value), ``choice`` (one of ``choices``), ``path`` (complete file names), ``number`` or
    ``text`` (nothing to complete)."""

    names: list[str]
    help: str
    metavar: str
    kind: str = "text"
    choices: list[str] = field(default_factory=list)
    default: str = ""
    required: bool = False
    multiple: bool = False  # repeatable (``--rule A --rule B``)

    @property
    def is_flag(self) -> bool:
        return self.kind == "flag"


@dataclass
class Cmd:
    name: str
    help: str
    usage: str
    options: list[Opt]
    arguments: list[Opt]
    aliases: list[str] = field(default_factory=list)


def _annotation_choices(annotation: Any) -> list[str]:
    """Enum members (or Literal values) of an option's annotation, through Optional/list."""
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [str(m.value) for m in annotation]
    if typing.get_origin(annotation) is typing.Literal:
        return [str(a) for a in typing.get_args(annotation)]
    for arg in typing.get_args(annotation):
        found = _annotation_choices(arg)
        if found:
            return found
    return []


def _base_types(annotation: Any) -> set[type]:
    """The plain classes inside an annotation (through Optional, list, Annotated)."""
    if isinstance(annotation, type):
        return {annotation}
    return {t for arg in typing.get_args(annotation) for t in _base_types(arg)}


def _kind(param: Any, choices: list[str]) -> str:
    if getattr(param, "is_flag", False):
        return "flag"
    if choices:
        return "choice"
    descriptor = getattr(param, "type_descriptor", None)
    types = _base_types(descriptor.annotation) if descriptor is not None else set()
    if any(isinstance(t, type) and issubclass(t, pathlib.PurePath) for t in types):
        return "path"
    if types & {int, float}:
        return "number"
    return "text"


def _describe(param: Any) -> Opt:
    descriptor = getattr(param, "type_descriptor", None)
    choices = _annotation_choices(descriptor.annotation) if descriptor is not None else []
    if getattr(param, "metavar", None) == "CODE":  # --rule / --skip-rule: the analyzer's rule codes
        from ftkit.analysis.registry import all_rules

        choices = list(all_rules())
    kind = _kind(param, choices)
    if getattr(param, "metavar", None) == "PRESET|PATH":  # train --model: a preset or a model directory
        from ftkit.model.presets import PRESETS

        choices, kind = list(PRESETS), "choice_or_path"
    default = param.default
    shown = "" if default in (None, False, (), []) or callable(default) else str(getattr(default, "value", default))
    return Opt(
        names=list(param.opts) + list(getattr(param, "secondary_opts", []) or []),
        help=(getattr(param, "help", None) or "").strip(),
        metavar=(param.name or "").upper(),
        kind=kind,
        choices=choices,
        default=shown,
        required=bool(param.required),
        multiple=bool(getattr(param, "multiple", False)),
    )


def collect() -> tuple[list[Opt], list[Cmd]]:
    """The root options and every visible command; a hidden command that shares a visible
    command's callback is listed as that command's alias."""
    cli.register_commands()
    group = typer.main.get_command(cli.app)
    assert isinstance(group, typer.core.TyperGroup), "ftkit's app has several commands, so typer builds a group"
    root_opts = [
        _describe(p) for p in group.params if p.param_type_name == "option" and not getattr(p, "hidden", False)
    ]
    visible = {cmd.callback: name for name, cmd in group.commands.items() if not cmd.hidden}
    commands: list[Cmd] = []
    for name, cmd in group.commands.items():
        if cmd.hidden:
            continue
        params = [p for p in cmd.params if not getattr(p, "hidden", False)]
        args = [p for p in params if p.param_type_name == "argument"]
        usage = " ".join(
            ["ftkit", name, "[OPTIONS]"] + [(p.name or "").upper() + ("..." if p.nargs == -1 else "") for p in args]
        )
        commands.append(
            Cmd(
                name=name,
                help=(cmd.help or "").strip(),
                usage=usage,
                options=[_describe(p) for p in params if p.param_type_name == "option"]
                + [Opt(names=["--help", "-h"], help="Show this message and exit.", metavar="", kind="flag")],
                arguments=[_describe(p) for p in args],
                aliases=[n for n, c in group.commands.items() if c.hidden and visible.get(c.callback) == name],
            )
        )
    return root_opts, commands


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_cli_md() -> str:
    root_opts, commands = collect()
    out = [
        "# CLI reference",
        "",
        f"_Generated by `{COMMAND}` from the Typer app; do not edit by hand._",
        "",
        "```",
        "ftkit [--version] [--debug] COMMAND [ARGS]...",
        "```",
        "",
        "| root option | description |",
        "|---|---|",
    ]
    out += [f"| `{', '.join(o.names)}` | {_md_escape(o.help)} |" for o in root_opts]
    out.append("")
    if not commands:
        out += ["No commands are registered yet.", ""]
    for c in commands:
        out += [f"## `ftkit {c.name}`", ""]
        if c.aliases:
            out += ["Alias: " + ", ".join(f"`ftkit {a}`" for a in c.aliases), ""]
        out += [c.help, "", "```", c.usage, "```", ""]
        if c.arguments:
            out += ["| argument | description |", "|---|---|"]
            out += [
                f"| `{a.metavar}` | {_md_escape(a.help)}{' (required)' if a.required else ''} |" for a in c.arguments
            ]
            out.append("")
        out += ["| option | value | default | description |", "|---|---|---|---|"]
        for o in c.options:
            value = "" if o.is_flag else ("|".join(o.choices) if o.choices else o.metavar)
            out.append(
                f"| `{', '.join(o.names)}` | {_md_escape(value)} | {_md_escape(o.default)} | {_md_escape(o.help)} |"
            )
        out.append("")
    out.append(OUTPUT_CONTRACT)
    return "\n".join(out)


OUTPUT_CONTRACT = """## Output of the reporting commands

`analyze-events`, `compare-dumps`, `compare-runs` and `train` report through one output path
(`ftkit.report.emit`); `--format` chooses what stdout carries:

- `human` (default): Rich tables. When stdout is not a terminal nothing is hard-wrapped (a
  line is as long as its content). Control characters that came from the inputs (ESC, CSI,
  BEL, bidirectional overrides in tensor names, file names, log fields) are printed as
  visible `\\xNN` / `\\uNNNN` escapes, never sent to the terminal.
- `json`: one strict JSON document (RFC 8259) with `schema_version` and `verdict`; non-finite
  numbers are the strings `"NaN"`, `"Infinity"`, `"-Infinity"` (node, jq and Python's strict
  parsers read it). Each finding carries `code`, `rule`, `severity`, `message`, `evidence`
  and `fix` (how to fix; empty when the producer has none).
- `github`: GitHub Actions workflow commands. Every field is escaped per the runner's rules
  (message: `%`, CR, LF; properties also `:` and `,`), so no input can start a line of its
  own. `file=` is relative to `$GITHUB_WORKSPACE` (or the current directory); a location
  outside it is named in the message instead. At most 10 lines: the most severe findings,
  one line counting those not annotated, and the verdict line (`::error` when the command
  fails, `::notice` when it passes). With `$GITHUB_STEP_SUMMARY` set, a Markdown summary is
  appended to it; every table cell is escaped (`|`, line breaks, HTML, Markdown links).

`--junit-xml PATH` (and `--html FILE` of analyze-events, compare-dumps and compare-runs) also
write a report file; the path's directory must exist and be writable, which is checked while the command line is parsed
(exit 2 before any work). The JUnit XML is well-formed for any input (characters XML cannot
hold become visible escapes) and valid for Ant/Jenkins- and Surefire-style readers: every
test case has a `time`, holds at most one `<failure>` (several findings of one case are one
failure that counts the rest) or one `<skipped>` (a rule that checked nothing), and the
`tests`/`failures`/`skipped` counts equal those elements. In the human output every name
from an input (tensor, file, run, host) is printed literally and on one line: control
characters (line feeds included) become visible escapes such as `\\n` and `\\x1b`, Rich markup
(`[bold]`) and emoji codes (`:warning:`) stay text, so no name can start a line that a log
reader acts on (a GitHub runner turns a plain-log line starting with `::` into an
annotation). Progress goes to stderr, in human mode only: a bar when stderr is a terminal
or `FTKIT_PROGRESS=1`; otherwise (a CI log, a file) a plain line every 10 s of long work
(`Analyzing events: 1,000 of 4,000 (25%), 10 s`, then `done`; work under 10 s prints
nothing); `FTKIT_PROGRESS=0` turns progress off. While a command runs, anything that is not its data (Ray's
and other libraries' messages, their child processes' output) goes to stderr.
"""


def render_exit_codes_md() -> str:
    rows = [
        (cli.EXIT_OK, "clean: no findings (or none at or above `--fail-on`), the command did what was asked"),
        (
            cli.EXIT_FINDINGS,
            "findings: a mismatch, a failed verification, analyzer findings at or above `--fail-on`, "
            "a training run whose own forensics found something, or that could not go on (every cell "
            "lost, `--min-cells` or `--max-retries` exhausted: `run_finished` status `failed`, "
            "`status.json` says why)",
        ),
        (
            cli.EXIT_USAGE,
            "usage, configuration or unusable input, found before any work where it can be: one line "
            "`Error: <what>` and a `Hint:` on stderr, nothing on stdout, no traceback",
        ),
        (cli.EXIT_INTERNAL, "internal error (a bug): any uncaught exception; `--debug` shows the traceback"),
        (129, "hung up (SIGHUP: the terminal or ssh session closed): as 130"),
        (130, "interrupted (Ctrl-C, SIGINT): `ftkit train` stops at once, logs `interrupted`, leaves no actor"),
        (143, "terminated (SIGTERM): as 130"),
    ]
    lines = [
        "# Exit codes",
        "",
        f"_Generated by `{COMMAND}` from `ftkit.cli`._",
        "",
        "Every `ftkit` command follows the same contract (DESIGN.md section 6).",
        "",
        "| code | meaning |",
        "|---|---|",
    ]
    lines += [f"| {code} | {text} |" for code, text in rows]
    lines += [
        "",
        "stdout carries data only (reports, JSON); progress, warnings, errors and hints go to stderr.",
        "",
        FAIL_CLOSED,
    ]
    return "\n".join(lines)


FAIL_CLOSED = """## Fail closed

The forensic commands (`analyze-events`, `compare-dumps`, `verify-checkpoint`, and the
forensics that end `train`) treat missing evidence as a finding, never as a pass:

- **Exit 0 means every expected piece of evidence was present and checked.** What is expected
  comes from what the run declared (the driver's log: alive cells per epoch, steps
  dispatched, the run's end; a dump's index; a checkpoint's manifest), never from which
  files or lines happen to be present.
- **Exit 1 for anything lost or damaged inside readable inputs**: a lost, cut, duplicated,
  malformed or invalid log line, expected evidence that is absent, a tensor, file, rollout or
  checkpoint present on one side only, a tensor no `--rules` entry covers, a
  non-finite value where the contract forbids one.
- **Exit 2 when an input cannot be used at all**: a path that does not exist or is not a
  regular file or directory (a FIFO, a device or a socket is refused, never read), a file
  whose header or index cannot be decoded safely, bad options, or a configuration that is
  invalid (values are typed strictly and must be finite; the field is named). The check
  happens before any work where it can (`--junit-xml`/`--html` directories, `train --out`,
  `--config`), and nothing is written or deleted.
- **`compare-runs`: exit 2 for a damaged log.** A comparison of two runs reads each log with
  the integrity rules of `analyze-events` (FT111, FT112, FT106); an error of theirs (a cut log,
  a `seq` gap, a stream without `log_closed`, a forged line) makes that input unusable, said in
  one line: a damaged log is never compared as if whole (docs/compare-runs.md).
- **Never another outcome**: no input makes a command exit 3, die on a signal or hang; exit 3
  is reserved for bugs in ftkit. The test suite checks this with randomised, seeded inputs
  (mutated event logs and safetensors files and trees, each run under a timeout).
"""


def artefacts() -> dict[Path, str]:
    """Every generated file, relative to the repository root, with its content."""
    collected = collect()
    files = {
        Path("docs/cli.md"): render_cli_md(),
        Path("docs/exit-codes.md"): render_exit_codes_md(),
        Path("completions/ftkit.bash"): render_bash(*collected),
        Path("completions/ftkit.zsh"): render_zsh(*collected),
        Path("completions/ftkit.fish"): render_fish(*collected),
    }
    if importlib.util.find_spec("ftkit.events.schema") is not None:
        from ftkit.events.schema_doc import schema_markdown

        files[Path("docs/event-schema.md")] = schema_markdown()
    return files


def stale(root: Path = ROOT) -> list[Path]:
    return [
        rel
        for rel, text in artefacts().items()
        if not (root / rel).is_file() or (root / rel).read_text(encoding="utf-8") != text
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is stale")
    args = parser.parse_args(argv)
    if args.check:
        bad = stale()
        for rel in bad:
            print(f"stale: {rel} (run: {COMMAND})", file=sys.stderr)
        return 1 if bad else 0
    for rel, text in artefacts().items():
        (ROOT / rel).parent.mkdir(parents=True, exist_ok=True)
        (ROOT / rel).write_text(text, encoding="utf-8")
        print(f"wrote {rel}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
