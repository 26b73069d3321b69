"""Strict typing of config values, whether from options or a config file: an integer field
takes an integer (not ``true``, not ``"2"``, not ``2.0``), a float field a finite number (not
``inf``, not NaN), a flag a boolean, a text field a string, a list field a list of strings.
``type_problem`` says why a value does not fit (``None`` when it does)."""

from __future__ import annotations

import math
import types
import typing
from pathlib import Path, PurePath
from typing import Any, Literal


def _describe(value: object) -> str:
    text = repr(value)
    return f"{text[:40]}... ({type(value).__name__})" if len(text) > 40 else f"{text} ({type(value).__name__})"


def type_problem(annotation: object, value: object) -> str | None:
    """Why ``value`` does not strictly have type ``annotation`` (None when it does, or when the
    annotation is not one this check knows: pydantic then decides)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        problems = [type_problem(a, value) for a in args]
        return None if any(p is None for p in problems) else next(p for p in problems if p)
    if annotation is type(None):
        return None if value is None else "expected nothing (null)"
    if annotation is bool:
        return None if isinstance(value, bool) else f"expected true or false, got {_describe(value)}"
    if annotation is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else f"expected an integer, got {_describe(value)}"
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"expected a number, got {_describe(value)}"
        return None if math.isfinite(value) else f"expected a finite number, got {value}"
    if annotation is str or origin is Literal:
        return None if isinstance(value, str) else f"expected a string, got {_describe(value)}"
    if annotation is Path:
        return None if isinstance(value, (str, PurePath)) else f"expected a path (a string), got {_describe(value)}"
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            return f"expected a list, got {_describe(value)}"
        inner: Any = args[0] if args else Any
        for item in value:
            problem = type_problem(inner, item)
            if problem:
                return f"in the list: {problem}"
        return None
    return None
