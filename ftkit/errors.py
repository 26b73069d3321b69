"""Domain errors that the CLI maps to exit codes.

Library code raises these for bad input; ``ftkit.cli`` turns them into one line
``Error: <what>`` plus a hint on stderr, and the exit code of DESIGN.md section 6.
Anything else that escapes a command is an internal error (exit 3).
"""

from __future__ import annotations


class FtkitError(Exception):
    """Base of every error ftkit reports to a user.

    ``message`` says what is wrong in one line; ``hint`` says what to do about it.
    """

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(FtkitError):
    """Bad options or option combinations (exit 2)."""


class InputError(FtkitError):
    """Unreadable, missing or malformed input files (exit 2)."""


class ConfigError(FtkitError):
    """An invalid training or rule configuration (exit 2)."""


class InstallError(FtkitError, ImportError):
    """A part of ftkit's own install is missing, e.g. its compiled kernels were not built (exit 2:
    nothing a rerun fixes; the hint says how to repair the install). An ``ImportError`` too, as
    it is raised while importing."""
