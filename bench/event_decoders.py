"""Decoder candidates for ``analyze-events`` (issue 10, item 3), measured on the same lines.

Per line of a synthetic run log (``--tensors 100``: the project's mix, fingerprint tables of 100
tensors; ``--tensors 4``: many small events), CPU time of:

- ``json``: ``json.loads`` (the baseline the issue's ratio is against);
- ``orjson``: ``orjson.loads``; ``orjson+check``: plus the compiled structural check the analyzer
  runs (``ftkit.events.validate``: types, literals, numeric elements);
- ``pydantic-json``: ``TypeAdapter(Event).validate_json`` (pydantic-core parses and validates in
  one pass, strict);
- ``msgspec``: ``msgspec.json.decode`` untyped, and ``msgspec-typed``: decoding into tagged
  ``msgspec.Struct`` types for the three most frequent event types (the rest untyped) -- only
  when msgspec is importable (it is not a dependency).

(No ``from __future__ import annotations`` here: msgspec reads the local Struct annotations at runtime.)

Usage: ``python bench/event_decoders.py [--events 20000] [--tensors 100]``. Prints ns per line and
the ratio to ``json``.
"""

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ftkit.events.schema import Event
from ftkit.events.validate import CHECKS
from ftkit.testing.synthetic import generate
from ftkit.testing.synthetic_spec import SyntheticSpec


def _lines(events: int, tensors: int) -> list[bytes]:
    per_rollout = 8 * (3 * 4 * 4 + 1) + 4
    spec = SyntheticSpec(
        cells=4, tp=2, pp=2, engines=2, rollouts=max(1, events // per_rollout), steps_per_rollout=8, tensors=tensors
    )
    with tempfile.TemporaryDirectory() as d:
        run = generate(d, spec)
        return [line for p in sorted(Path(run.events_dir).glob("*.jsonl")) for line in p.read_bytes().splitlines()]


def _time(fn: Callable[[bytes], Any], lines: list[bytes], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        for line in lines:
            fn(line)
        best = min(best, time.process_time() - t0)
    return best


def candidates() -> dict[str, Callable[[bytes], Any]]:
    import orjson
    from pydantic import TypeAdapter

    def checked(line: bytes) -> bool:
        ev = orjson.loads(line)
        return CHECKS[ev["type"]](ev)

    adapter: TypeAdapter[Any] = TypeAdapter(Event)
    out: dict[str, Callable[[bytes], Any]] = {
        "json": json.loads,
        "orjson": orjson.loads,
        "orjson+check": checked,
        "pydantic-json": lambda line: adapter.validate_json(line, strict=True),
    }
    try:
        import msgspec
    except ImportError:
        return out

    class Src(msgspec.Struct):
        role: str
        cell: int | None
        rank: int | None
        incarnation: int
        pid: int
        host: str

    class Base(msgspec.Struct, tag_field="type", forbid_unknown_fields=False):
        schema: int
        run: str
        time: float
        source: Src
        seq: int

    class StepOutcome(Base, tag="step_outcome"):
        rollout: int
        step: int
        attempt: int
        epoch: int
        cell: int
        outcome: str
        micro_shards: list[int]
        rank: int | None = None

    class Fingerprint(Base, tag="state_fingerprint"):
        rollout: int
        step: int
        attempt: int
        cell: int
        total: str
        params: dict[str, str]
        optimizer: dict[str, str]
        rank: int | None = None

    class WitnessCounts(Base, tag="witness_counts"):
        rollout: int
        step: int
        attempt: int
        cell: int
        ids: list[int]
        counts: list[int]
        contributions: list[float]
        rank: int | None = None

    typed = msgspec.json.Decoder(StepOutcome | Fingerprint | WitnessCounts)
    untyped = msgspec.json.Decoder()
    hot = (b'"type":"step_outcome"', b'"type":"state_fingerprint"', b'"type":"witness_counts"')

    def typed_decode(line: bytes) -> Any:
        return typed.decode(line) if any(h in line[:80] for h in hot) else untyped.decode(line)

    out["msgspec"] = untyped.decode
    out["msgspec-typed"] = typed_decode
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=20000)
    p.add_argument("--tensors", type=int, default=100)
    args = p.parse_args()
    lines = _lines(args.events, args.tensors)
    size = sum(map(len, lines))
    print(f"{len(lines)} lines, {size / len(lines):.0f} bytes per line on average (--tensors {args.tensors})")
    results = {name: _time(fn, lines) for name, fn in candidates().items()}
    for name, seconds in results.items():
        print(f"{name:>14}: {seconds / len(lines) * 1e9:>8.0f} ns/line  ratio to json {seconds / results['json']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
