"""Escaping of untrusted text for each output medium ftkit writes.

Tensor names, file names, log fields and messages come from inputs that an attacker may have
written. Every renderer passes them through the function for its medium:

- ``terminal(text)``: C0/C1 control characters (ESC, CSI, BEL, ...), DEL, the Unicode line
  and paragraph separators and bidirectional overrides become visible ``\\xNN`` /
  ``\\uNNNN`` escapes, so no input moves the cursor, sets a title, recolours the terminal or
  starts a line. Newlines and tabs are kept.
- ``one_line(text)``: ``terminal`` plus line feeds, carriage returns and tabs as visible
  ``\\n`` / ``\\r`` / ``\\t``: a name or message from an input stays on its line, so it cannot
  start a line a log reader acts on (a GitHub runner turns any line starting with ``::`` into
  an annotation). ``literal(text)`` is ``one_line`` with Rich markup escaped, for the human
  renderers (``[bold]`` stays text; the consoles never render ``:emoji:`` codes).
- ``md_cell(text)`` / ``md_text(text)``: Markdown for the GitHub step summary: HTML is escaped,
  ``|`` cannot end a table cell, a newline cannot end a row, and Markdown punctuation is
  backslash-escaped so no input makes links, images or emphasis.
- ``xml_text(text)``: characters XML 1.0 cannot hold (controls other than tab/newline/CR,
  lone surrogates, U+FFFE/U+FFFF) become visible escapes; the XML writer escapes the rest.
- ``strict_json(obj)``: a copy of a result tree that strict JSON can hold: non-finite floats
  are the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` (JSON has no such numbers).
"""

from __future__ import annotations

import html
import math
import os
import re
from enum import Enum
from typing import Any

_TERMINAL_BAD = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_MD_PUNCT = re.compile(r"([\\`*_{}\[\]()#+!~>|-])")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal(text: str) -> str:
    """``text`` with every control character that a terminal would interpret made visible."""
    return _TERMINAL_BAD.sub(_visible, text)


def one_line(text: object) -> str:
    """``text`` on one line, every control character visible (see the module docstring)."""
    return terminal(str(text)).replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


def literal(text: object) -> str:
    """``one_line(text)`` as Rich markup that prints exactly that text."""
    from rich.markup import escape

    return escape(one_line(text))


def xml_text(text: str) -> str:
    """``text`` with the characters XML 1.0 cannot represent made visible."""
    return _XML_BAD.sub(_visible, text)


def md_text(text: str) -> str:
    """``text`` as inert Markdown on one line: no HTML, no links, no emphasis, no line break."""
    flat = " ".join(terminal(text).splitlines())
    return _MD_PUNCT.sub(r"\\\1", html.escape(flat, quote=False))


def md_cell(value: object) -> str:
    """One GitHub-flavoured Markdown table cell holding ``value`` literally."""
    return md_text(str(value))


def strict_json(obj: Any) -> Any:
    """A copy of ``obj`` that ``json.dumps(..., allow_nan=False)`` accepts: non-finite floats
    become ``"NaN"``/``"Infinity"``/``"-Infinity"``; pydantic models, enums, sets and paths
    become their JSON forms. One pass, with fast paths for the builtin types."""
    kind = type(obj)
    if kind is str or kind is int or kind is bool or obj is None:
        return obj
    if kind is float:
        return obj if obj - obj == 0.0 else _nonfinite(obj)
    if kind is dict:
        return {k: strict_json(v) for k, v in obj.items()}
    if kind is list or kind is tuple:
        return [strict_json(v) for v in obj]
    if hasattr(obj, "model_dump"):
        return strict_json(obj.model_dump(mode="json"))
    if isinstance(obj, Enum):
        return strict_json(obj.value)
    if isinstance(obj, float):
        return strict_json(float(obj))
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted(strict_json(v) for v in obj)
    if hasattr(obj, "__fspath__"):
        return os.fspath(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _nonfinite(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"
