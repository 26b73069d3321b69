"""Fast structural validation of decoded events, derived from the pydantic models.

Full pydantic validation per line costs about as much as decoding it, so the analyzer uses
``is_valid(event)``: for the event's type it checks that every required field is present with
the right JSON type (literal fields hold an allowed value, integers used as floats fit a float,
lists and dicts of numbers are checked element by element, so no rule ever meets a value it
cannot compute with). Only when that fails is ``explain(event)`` called, which runs the pydantic
model and returns its message. The checks are compiled once, at import, into one boolean
expression per type, from the models. ``known(type)`` tells whether a type is known at all
(unknown types are skipped with a warning).
"""

from __future__ import annotations

from collections.abc import Callable
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from ftkit.events.schema import EVENT_TYPES, parse_event

_FLOAT_MAX = 1.7976931348623157e308  # an integer beyond this cannot be used as a float


class _Compiler:
    """Turns field annotations into Python boolean expressions (one function per event type).

    Scalars are checked by exact JSON type (``bool`` is not an ``int``; an ``int`` is a ``float``
    only when a float can hold it); Literals by value; lists and dicts element by element, except
    dicts of strings (fingerprint tables, compared by equality only), whose size would make the
    check cost more than the decoding.
    """

    def __init__(self) -> None:
        self.env: dict[str, Any] = {"_KeyError": KeyError, "_FLOAT_MAX": _FLOAT_MAX}
        self._vars = 0

    def _const(self, value: Any) -> str:
        name = f"C{len(self.env)}"
        self.env[name] = value
        return name

    def term(self, expr: str, ann: Any) -> str | None:
        """An expression that is true when ``expr`` matches ``ann`` (None: anything goes)."""
        origin, args = get_origin(ann), get_args(ann)
        if origin is Annotated:
            return self.term(expr, args[0])
        if origin is Literal:
            kinds, values = {type(a) for a in args}, self._const(frozenset(args))
            if len(kinds) == 1:  # the common case: `is` costs less than a set lookup
                return f"(type({expr}) is {self._const(kinds.pop())} and {expr} in {values})"
            return f"(type({expr}) in {self._const(frozenset(kinds))} and {expr} in {values})"
        if origin is Union or origin is UnionType:
            parts = [f"{expr} is None" if a is type(None) else self.term(expr, a) for a in args]
            return None if None in parts else "(" + " or ".join(parts) + ")"  # type: ignore[arg-type]
        if origin is list:
            return f"(type({expr}) is list{self._each(expr, args[0])})"
        if origin is dict or (isinstance(ann, type) and issubclass(ann, BaseModel)):
            each = ""
            if origin is dict and args and args[1] is not str and get_args(args[1])[:1] != (str,):
                each = self._each(f"{expr}.values()", args[1])
            return f"(type({expr}) is dict{each})"
        if ann is float:
            return f"(type({expr}) is float or (type({expr}) is int and -_FLOAT_MAX <= {expr} <= _FLOAT_MAX))"
        if ann is int:
            return f"(type({expr}) is int)"
        if ann is str:
            return f"(type({expr}) is str)"
        return None

    def _each(self, items: str, ann: Any) -> str:
        """`` and <every element of items matches ann>``: one C-level pass over the element types
        (``TYPES.issuperset(map(type, items))``) when that decides it, the exact check only when it does not (an
        int where a float is wanted must fit a float)."""
        self._vars += 1
        var = f"x{self._vars}"
        exact = self.term(var, ann)
        if exact is None:
            return ""
        flat = _flat_types(ann)
        if flat is None:
            return f" and all({exact} for {var} in {items})"
        fast = f"{self._const(flat)}.issuperset(map(type, {items}))"  # no set is built
        if float in flat:  # ints are allowed too, when a float can hold them
            return f" and ({fast} or all({exact} for {var} in {items}))"
        return f" and {fast}"

    def compile(self, model: type[BaseModel]) -> Callable[[dict[str, Any]], bool]:
        """One boolean expression per type (a loop over the fields costs twice as much per line)."""
        terms = []
        for name, field in model.model_fields.items():
            key = field.alias or name
            if key == "type":
                continue
            term = self.term(f"e[{key!r}]", field.annotation)
            if term is None:
                continue
            terms.append(term if field.is_required() else f"({key!r} not in e or {term})")
        src = (
            "def check(e):\n    try:\n        return "
            + " and ".join(terms or ["True"])
            + "\n    except _KeyError:\n        return False\n"
        )
        env = dict(self.env)
        exec(compile(src, f"<ftkit.events.validate:{model.__name__}>", "exec"), env)  # noqa: S102 - built from the schema
        check: Callable[[dict[str, Any]], bool] = env["check"]
        return check


def _flat_types(ann: Any) -> frozenset[type] | None:
    """The exact JSON types that satisfy a scalar annotation (int, str, float, None and unions of
    them; a float's ints are left to the exact check), or None when more than the type matters."""
    origin, args = get_origin(ann), get_args(ann)
    if origin is Annotated:
        return _flat_types(args[0])
    if origin is Union or origin is UnionType:
        parts = [frozenset({type(None)}) if a is type(None) else _flat_types(a) for a in args]
        return None if None in parts else frozenset().union(*parts)  # type: ignore[arg-type]
    return frozenset({ann}) if ann in (int, str, float) else None


_COMPILER = _Compiler()
CHECKS: dict[Any, Callable[[dict[str, Any]], bool]] = {
    name: _COMPILER.compile(model) for name, model in EVENT_TYPES.items()
}


def is_valid(event: dict[str, Any]) -> bool:
    """True when ``event`` (of a known type) has every required field with the right JSON type."""
    t = event.get("type")
    check = CHECKS.get(t) if type(t) is str else None
    return check is not None and check(event)


def known(type_name: Any) -> bool:
    """Whether ``type_name`` is an event type of this schema (False for anything not a string)."""
    return type(type_name) is str and type_name in CHECKS


def explain(event: dict[str, Any]) -> str:
    """Why ``event`` is invalid, in one line (the pydantic message; '' when it is valid)."""
    try:
        parse_event(event)
    except ValidationError as exc:
        errs = exc.errors()
        parts = []
        for e in errs[:3]:
            loc = ".".join(str(x) for x in e["loc"][1:] or e["loc"])
            parts.append(f"{loc}: {e['msg']}")
        more = f" (+{len(errs) - 3} more)" if len(errs) > 3 else ""
        return "; ".join(parts) + more
    return ""
