"""Fast structural validation of decoded events, derived from the pydantic models.

Full pydantic validation per line costs about as much as decoding it, so the analyzer uses
``is_valid(event)``: for the event's type it checks that every required field is present with
the right JSON type (and literal fields hold an allowed value); containers are checked as
containers, not element by element. Only when that fails (or when a rule cannot use a line) is
``explain(event)`` called, which runs the pydantic model and returns its message. The checks
are compiled once, at import, into one boolean expression per type, from the models. ``kind(type)``
tells whether a type is known at all (unknown types are skipped with a warning).
"""

from __future__ import annotations

from collections.abc import Callable
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from ftkit.events.schema import EVENT_TYPES, parse_event

_NUM = (int, float)
_Spec = tuple[tuple[str, tuple[type, ...], frozenset[Any] | None, bool], ...]


def _json_types(ann: Any) -> tuple[tuple[type, ...], frozenset[Any] | None]:
    """Accepted Python types after JSON decoding, and the allowed values of a Literal."""
    origin, args = get_origin(ann), get_args(ann)
    if origin is Annotated:
        return _json_types(args[0])
    if origin is Literal:
        return tuple({type(a) for a in args}), frozenset(args)
    if origin is Union or origin is UnionType:
        types: set[type] = set()
        values: set[Any] | None = set()
        for a in args:
            if a is type(None):
                types.add(type(None))
                if values is not None:
                    values.add(None)
                continue
            t, v = _json_types(a)
            types.update(t)
            values = None if (v is None or values is None) else values | set(v)
        return tuple(types), (frozenset(values) if values is not None else None)
    if origin is list:
        return (list,), None
    if origin is dict or (isinstance(ann, type) and issubclass(ann, BaseModel)):
        return (dict,), None
    if ann is float:
        return _NUM, None
    if ann is int:
        return (int,), None
    if ann is str:
        return (str,), None
    return (object,), None


def _spec(model: type[BaseModel]) -> _Spec:
    out = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        if key == "type":
            continue
        types, values = _json_types(field.annotation)
        if object in types:
            continue
        out.append((key, types, values, field.is_required()))
    return tuple(out)


def _compile(spec: _Spec) -> Callable[[dict[str, Any]], bool]:
    """One boolean expression per type (a loop over the spec costs twice as much per line)."""
    env: dict[str, Any] = {"_KeyError": KeyError}
    terms = []
    for i, (key, types, values, required) in enumerate(spec):
        env[f"T{i}"], env[f"V{i}"] = frozenset(types), values
        get = f"e[{key!r}]" if required else f"e.get({key!r})"
        term = f"type({get}) in T{i}"
        if values is not None:
            term += f" and {get} in V{i}"
        if not required and type(None) not in types:
            term = f"({key!r} not in e or ({term}))"
        terms.append(f"({term})")
    src = (
        "def check(e):\n    try:\n        return "
        + " and ".join(terms or ["True"])
        + "\n    except _KeyError:\n        return False\n"
    )
    exec(compile(src, "<ftkit.events.validate>", "exec"), env)  # noqa: S102 - source built from the schema
    check: Callable[[dict[str, Any]], bool] = env["check"]
    return check


SPECS: dict[str, _Spec] = {name: _spec(model) for name, model in EVENT_TYPES.items()}
CHECKS: dict[Any, Callable[[dict[str, Any]], bool]] = {name: _compile(spec) for name, spec in SPECS.items()}


def is_valid(event: dict[str, Any]) -> bool:
    """True when ``event`` (of a known type) has every required field with the right JSON type."""
    check = CHECKS.get(event.get("type"))
    return check is not None and check(event)


def known(type_name: Any) -> bool:
    return type_name in SPECS


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
