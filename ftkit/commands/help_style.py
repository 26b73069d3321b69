"""How ``--help`` names parameters: what a user types, not Python types (issue 24 item 10).

Typer's own rendering shows a flag as ``<bool>``, a variadic argument as ``<list[Path]>``, a
bounded number as ``<int range>`` and required arguments in the usage line as ``{A} {B}``.
``HelpGroup`` (the root app's group class) gives every parameter of itself and of its commands
the conventions of Click and POSIX usage instead: a flag shows no value placeholder, a bounded
number ``<int> [x>=0]``, an argument is named by its metavar (``PATH...`` when it repeats), and
the usage line reads ``A B`` for required arguments and ``[PATH]`` for optional ones. Parsing,
completion and errors are unchanged: only the help text differs.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption


class _Argument(TyperArgument):
    def display_type_rich(self, ctx: Any) -> str | None:
        """The argument's name column (its metavar) already says what to type."""
        return None

    def _usage_display_name(self) -> str:
        name = self.display_name_raw + ("..." if self.nargs != 1 else "")
        return name if self.required else f"[{name}]"


class _Option(TyperOption):
    def display_type_rich(self, ctx: Any) -> str | None:
        """A flag takes no value, so it shows no placeholder; a bounded number shows ``<int>``
        (its bounds follow it), not ``<int range>``."""
        shown = super().display_type_rich(ctx)
        return None if self.is_flag else shown and shown.replace(" range>", ">")


def _restyle(param: Any) -> Any:
    if type(param) is TyperArgument:
        param.__class__ = _Argument
    elif type(param) is TyperOption:
        param.__class__ = _Option
    return param


class _Command(TyperCommand):
    def get_help_option(self, ctx: Any) -> Any:
        """``--help`` is made on demand, so it is restyled here."""
        return _restyle(super().get_help_option(ctx))


class HelpGroup(TyperGroup):
    """The root group: restyles its own and its commands' parameters (see the module docstring)."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for command in [self, *self.commands.values()]:
            for param in command.params:
                _restyle(param)
            if type(command) is TyperCommand:
                command.__class__ = _Command

    def get_help_option(self, ctx: Any) -> Any:
        """``--help`` is made on demand, so it is restyled here."""
        return _restyle(super().get_help_option(ctx))
