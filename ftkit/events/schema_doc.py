"""``schema_markdown()``: the reference page ``docs/event-schema.md``, rendered deterministically
from the models of ``ftkit.events.schema`` (model order, field order); ``scripts/cli_reference.py``
writes it and a test checks the page is fresh."""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

from ftkit.events.envelope import Envelope, Source
from ftkit.events.schema import EVENT_TYPES


def _type_name(ann: Any) -> str:
    """A short, table-safe rendering of a field annotation (``[int]``, ``{str: hex}``, ``int or null``)."""
    origin, args = get_origin(ann), get_args(ann)
    if origin is Annotated:
        return _type_name(args[0])
    if origin is Literal:
        return " or ".join(f"`{a}`" for a in args)
    if origin is Union or origin is UnionType:
        names = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(names + (["null"] if type(None) in args else []))
    if origin is list:
        return f"[{_type_name(args[0])}]"
    if origin is dict:
        return f"{{{_type_name(args[0])}: {_type_name(args[1])}}}"
    if ann is Any:
        return "any"
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "object"
    return getattr(ann, "__name__", str(ann))


def schema_markdown() -> str:
    """The reference page ``docs/event-schema.md`` (deterministic: model order, field order)."""
    lines = [
        "# Event log schema (version 2)",
        "",
        "<!-- generated from ftkit/events/schema.py; do not edit -->",
        "",
        "One JSON object per line, UTF-8. Files live under `events/`, one per process incarnation",
        "(`<role>[-c<cell>][-r<rank>]-i<incarnation>.jsonl`, optionally gzipped). Field names are a",
        "public contract: fields and types may be added, never renamed. Non-finite floats are the",
        "`NaN` / `Infinity` / `-Infinity` literals Python's json module writes. Readers skip unknown",
        "types with a warning. `step` is the run-global optimizer step (a retried step keeps its",
        "number and raises `attempt`); `rollout` is the rollout index. Version 2 adds `log_closed` (the",
        "last line of every writer that closed normally); version 1 logs are still read.",
        "",
        "## Envelope (every line)",
        "",
        "| field | type | meaning |",
        "|---|---|---|",
    ]
    for name, f in Envelope.model_fields.items():
        lines.append(f"| `{f.alias or name}` | {_type_name(f.annotation)} | {f.description} |")
    lines += ["", "`source`:", "", "| field | type | meaning |", "|---|---|---|"]
    for name, f in Source.model_fields.items():
        lines.append(f"| `{name}` | {_type_name(f.annotation)} | {f.description} |")
    for type_name, model in EVENT_TYPES.items():
        lines += [
            "",
            f"## `{type_name}`",
            "",
            (model.__doc__ or "").strip(),
            "",
            "| field | type | required | meaning |",
            "|---|---|---|---|",
        ]
        for name, f in model.model_fields.items():
            if name in Envelope.model_fields:
                continue
            req = "yes" if f.is_required() else "no"
            lines.append(f"| `{name}` | {_type_name(f.annotation)} | {req} | {f.description} |")
    return "\n".join(lines) + "\n"
