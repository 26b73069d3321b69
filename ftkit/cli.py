"""The ``ftkit`` command: the Typer root app and the error -> exit code mapping.

Exit codes (DESIGN.md section 6): 0 clean, 1 findings, 2 usage / config / unreadable input,
3 internal error. ``main`` is the console-script entry point: it runs the app without Click's
standalone handling so that every exception is mapped here, once: ``FtkitError`` and Click
usage errors print ``Error: <what>`` plus a hint (exit 2), anything else is an internal
error (exit 3) whose traceback is shown only with ``--debug``. While a command runs, its
data goes to a private duplicate of stdout and anything else written to stdout (by Ray or
another library, or by processes they start) goes to stderr (``guard_stdout``).

Subcommands live in ``ftkit.commands``; each module exposes ``register(app)``.
"""

from __future__ import annotations

import contextlib
import sys
import traceback
from collections.abc import Sequence
from typing import Annotated

import typer

try:  # typer >= 0.20 vendors click under typer._click
    from typer._click import exceptions as _cx
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import exceptions as _cx  # type: ignore[no-redef]

from ftkit import __version__, hard_exit
from ftkit.commands.help_style import HelpGroup
from ftkit.errors import FtkitError
from ftkit.report.escaping import one_line
from ftkit.report.sink import OutputClosed, guard_stdout

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3

app = typer.Typer(
    name="ftkit",
    cls=HelpGroup,
    help="Fault-tolerant Megatron training on Ray, and the forensics to prove a run stayed correct.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Exit codes: 0 clean, 1 findings, 2 usage or unreadable input, 3 internal error.",
)

_state = {"debug": False}


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"ftkit {__version__}\n")
        raise typer.Exit(EXIT_OK)


@app.callback()
def root(
    version: Annotated[
        bool | None, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = None,
    debug: Annotated[
        bool, typer.Option("--debug", help="Show tracebacks for errors (a global option: before the command).")
    ] = False,
) -> None:
    """Fault-tolerant Megatron training on Ray, and the forensics to prove a run stayed correct."""
    _state["debug"] = debug


_registered: list[str] = []


def register_commands(args: Sequence[str] | None = None) -> None:
    """Register the subcommands on ``app``: when ``args`` (a command line without the program
    name) names a known command, only that command's module is imported (start-up); otherwise
    (no args, help, an unknown name) all of them, in ``COMMAND_MODULES`` order. Idempotent."""
    import importlib

    from ftkit.commands import COMMAND_MODULES, COMMAND_NAMES

    first = next((a for a in args if not a.startswith("-")), None) if args is not None else None
    if first in COMMAND_NAMES:
        wanted = [COMMAND_NAMES[first]]
    else:
        wanted = COMMAND_MODULES
        if _registered != COMMAND_MODULES[: len(_registered)]:  # some, out of order: start over (help order)
            app.registered_commands.clear()
            _registered.clear()
    for name in wanted:
        if name not in _registered:
            importlib.import_module(f"ftkit.commands.{name}").register(app)
            _registered.append(name)


def _error(message: str, hint: str | None = None) -> None:
    """``Error: <message>`` and ``Hint: <hint>``, one line each; text from the inputs (paths,
    tensor names) cannot break the lines or reach the terminal as control sequences. A stderr
    that is gone (a hung-up terminal, a closed pipe) loses the lines, not the exit code."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"Error: {one_line(message)}\n")
        if hint:
            sys.stderr.write(f"Hint: {one_line(hint)}\n")
        sys.stderr.flush()


#: The root's own options: they go before the subcommand (``ftkit --debug check-model ...``).
GLOBAL_OPTIONS = ("--debug", "--version")


def _global_part(args: Sequence[str]) -> list[str]:
    """The arguments before the subcommand (the first that is not an option): where the root's
    options are read; a ``--debug`` after the subcommand is that command's unknown option."""
    out = []
    for a in args:
        if not a.startswith("-"):
            break
        out.append(a)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns (and, as a console script, exits with) the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in _global_part(args)
    try:
        register_commands(args)
        with guard_stdout():  # stdout carries the command's data only (see ftkit.report.sink)
            code = app(args=args, prog_name="ftkit", standalone_mode=False)
        code = EXIT_OK if code is None else int(code)
    except typer.Exit as exc:
        code = exc.exit_code
    except typer.Abort:
        _error("interrupted")
        code = 130
    except _cx.ClickException as exc:  # bad options: Click's own message, exit 2
        if debug:
            traceback.print_exc()
        if type(exc).__name__ == "NoArgsIsHelpError":  # help was printed already
            return EXIT_USAGE
        ctx_help = ""
        if isinstance(exc, _cx.NoSuchOption) and exc.option_name in GLOBAL_OPTIONS and exc.ctx is not None:
            ctx_help = (
                f"{exc.option_name} is a global option: put it before the subcommand, "
                f"e.g. 'ftkit {exc.option_name} {exc.ctx.info_name} ...'"
            )
        elif isinstance(exc, _cx.UsageError) and exc.ctx is not None:
            ctx_help = f"run '{exc.ctx.command_path} --help' for the options"
        _error(exc.format_message(), ctx_help or None)
        code = EXIT_USAGE
    except FtkitError as exc:
        if debug:
            traceback.print_exc()
        _error(exc.message, exc.hint)
        code = exc.exit_code
    except KeyboardInterrupt:
        _error("interrupted")
        code = 130
    except (BrokenPipeError, OutputClosed):  # the reader of stdout went away (``| head``): not a failure
        code = EXIT_OK
    except Exception as exc:  # noqa: BLE001 - the top-level handler of the CLI contract
        if debug:
            traceback.print_exc()
        _error(
            f"internal error: {type(exc).__name__}: {exc}",
            "this is a bug in ftkit; rerun with --debug for the traceback and report it",
        )
        code = EXIT_INTERNAL
    return code


def run() -> None:  # pragma: no cover - console script
    code = main()
    hard_exit.exit_now_if_requested(code)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    run()
