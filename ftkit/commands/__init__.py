"""One module per subcommand: parse options, call the library, render.

Each module named in ``COMMAND_MODULES`` exposes ``register(app)``; ``ftkit.cli`` imports
them in this order (which is the order of ``ftkit --help``). Only commands that work are
listed here.
"""

COMMAND_MODULES: list[str] = [
    "train",
    "dump",
    "compare_dumps",
    "compare_runs",
    "analyze_events",
    "verify_checkpoint",
    "check_model",
    "export",
]

# The module that registers each command name (aliases included): ``ftkit.cli`` imports only
# the module of the command being run, so one command's start-up never pays for another's
# imports (train's options are built from its pydantic config, for example).
COMMAND_NAMES: dict[str, str] = {
    "train": "train",
    "dump": "dump",
    "compare-dumps": "compare_dumps",
    "compare-runs": "compare_runs",
    "analyze-events": "analyze_events",
    "analyze": "analyze_events",
    "verify-checkpoint": "verify_checkpoint",
    "check-model": "check_model",
    "export": "export",
}
