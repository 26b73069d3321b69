"""The typed emitters (``ftkit.evidence.emit``) against the event schema: every event type a
producer writes has one, with the schema's field names, required where the schema requires the
field; and ftkit's producers write events through them only."""

import inspect
import re
from pathlib import Path

import ftkit.evidence.emit as emit
from ftkit.events.envelope import Envelope
from ftkit.events.schema import EVENT_TYPES

TRANSPORT = {"events_dropped", "log_closed"}  # EventWriter.close's own lines
PUBLISHER = {"checkpoint_published", "checkpoint_rejected", "checkpoint_cleanup_failed"}  # on_event


def _emitters() -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(fn)
        for name, fn in vars(emit).items()
        if inspect.isfunction(fn) and fn.__module__ == emit.__name__ and not name.startswith("_")
    }


def test_every_producer_event_type_has_an_emitter() -> None:
    assert set(_emitters()) == set(EVENT_TYPES) - TRANSPORT - PUBLISHER


def test_each_emitter_takes_the_schema_fields_required_as_the_schema_requires() -> None:
    for name, sig in _emitters().items():
        model = EVENT_TYPES[name]
        fields = {n: f for n, f in model.model_fields.items() if n not in Envelope.model_fields}
        params = dict(sig.parameters)
        assert list(params)[0] == "log", name
        del params["log"]
        assert set(params) == set(fields), name
        for n, p in params.items():
            assert p.kind is inspect.Parameter.KEYWORD_ONLY, (name, n)
            assert (p.default is inspect.Parameter.empty) == fields[n].is_required(), (name, n)


def test_producers_emit_through_the_typed_emitters_only() -> None:
    root = Path(emit.__file__).parents[1]
    raw = re.compile(r"\.emit\(\s*\"")
    found = [
        str(path.relative_to(root))
        for area in ("train", "evidence")
        for path in sorted((root / area).rglob("*.py"))
        if path.name != "emit.py" and raw.search(path.read_text())
    ]
    assert not found, found
