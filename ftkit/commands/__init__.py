"""One module per subcommand: parse options, call the library, render.

Each module named in ``COMMAND_MODULES`` exposes ``register(app)``; ``ftkit.cli`` imports
them in this order (which is the order of ``ftkit --help``). Only commands that work are
listed here.
"""

COMMAND_MODULES: list[str] = ["train", "dump", "compare_dumps", "analyze_events", "verify_checkpoint"]
