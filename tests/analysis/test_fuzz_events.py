"""Randomised, seeded suite of mutated event logs (issue 9: analyze-events never crashes, fails closed).

``FTKIT_FUZZ_CASES`` mutated logs (default 500, 2,000 in the full suite: ``tests/suite.py``) go
through the CLI's ``main`` in-process, each
under a SIGALRM timeout; a few more run as subprocesses, where a signal would show. Every case
must exit 0, 1 or 2 (never 3, never a signal, never a hang), and every case the generator labels
*lossy* (a line carrying evidence is gone: deleted, cut off at a line boundary, deleted with the
``seq`` renumbered and ``log_closed`` recounted to hide it, or a whole stream removed) must exit 1.
(Not lossy: the last line of a stream whose process died, i.e. never wrote ``log_closed``; losing
it cannot be told from the process dying one line earlier, and the driver declared the death.)
Mutations: byte flips, garbage lines, lines cut mid-way, fields replaced by values of the wrong
type / huge integers / deep nesting, duplicated lines, shuffles and splits over plain and gzipped
files, and the lossy ones above.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from suite import FULL

from ftkit import cli
from ftkit.testing.synthetic import generate
from ftkit.testing.synthetic_spec import SyntheticSpec

REPO = Path(__file__).resolve().parents[2]  # the tree under test, for subprocesses

CASES = int(os.environ.get("FTKIT_FUZZ_CASES", "2000" if FULL else "500"))
SUBPROCESS_CASES = 8
SEED = int(os.environ.get("FTKIT_FUZZ_SEED", "20261130"))
TIMEOUT_S = 60
EVIDENCE = {
    "run_started",
    "run_finished",
    "step_outcome",
    "state_fingerprint",
    "witness_counts",
    "witness_allocated",
    "weights_sent",
    "engine_weights",
}
WEIRD: list[Any] = [None, [], {}, [1, {"a": []}], 10**400, -(10**30), "x" * 300, True, 1.5, "NaN"]


@dataclass
class Case:
    files: dict[str, list[bytes]]
    lossy: list[str] = field(default_factory=list)  # why the log lost evidence (empty: not lossy)
    notes: list[str] = field(default_factory=list)


def _load(events: Path) -> dict[str, list[bytes]]:
    return {p.name: p.read_bytes().splitlines() for p in sorted(events.glob("*.jsonl"))}


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, list[bytes]]]:
    out = []
    for i, spec in enumerate(
        (
            SyntheticSpec(
                cells=2, engines=1, rollouts=2, steps_per_rollout=2, samples_per_rollout=8, tensors=4, faults=0
            ),
            SyntheticSpec(
                cells=3, engines=1, rollouts=2, steps_per_rollout=2, samples_per_rollout=8, tensors=4, faults=1
            ),
        )
    ):
        d = tmp_path_factory.mktemp(f"base{i}")
        generate(d, spec)
        out.append(_load(d / "events"))
    return out


def _type(line: bytes) -> str | None:
    try:
        ev = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return ev.get("type") if isinstance(ev, dict) else None


def _closed(lines: list[bytes]) -> bool:
    return bool(lines) and _type(lines[-1]) == "log_closed"


def mutate(base: dict[str, list[bytes]], rng: random.Random) -> Case:
    case = Case({k: list(v) for k, v in base.items()})
    for _ in range(rng.randint(1, 3)):
        name = rng.choice(sorted(case.files))
        lines = case.files[name]
        if not lines:
            continue
        i = rng.randrange(len(lines))
        kind = rng.choice(
            ["flip", "garbage", "cut_line", "field", "deep", "duplicate", "delete", "truncate", "forge", "drop_file"]
        )
        case.notes.append(f"{kind} {name}:{i + 1}")
        if kind == "flip":
            b = bytearray(lines[i])
            b[rng.randrange(len(b))] = rng.randrange(256)
            lines[i] = bytes(b).replace(b"\n", b" ")
        elif kind == "garbage":
            lines.insert(i, bytes(rng.randrange(1, 256) for _ in range(rng.randint(1, 40))).replace(b"\n", b"?"))
        elif kind == "cut_line" and len(lines[i]) > 2:
            lines[i] = lines[i][: rng.randrange(1, len(lines[i]) - 1)]
        elif kind == "field":
            try:
                ev = json.loads(lines[i])
                key = rng.choice(sorted(ev))
                ev[key] = rng.choice(WEIRD)
                lines[i] = json.dumps(ev).encode()
            except (ValueError, RecursionError, TypeError, IndexError, AttributeError):
                pass
        elif kind == "deep":
            depth = rng.choice([1000, 40_000, 100_000])
            lines.insert(i, rng.choice([b'{"a":' * depth + b"1" + b"}" * depth, b"[" * depth]))
        elif kind == "duplicate":
            lines.insert(rng.randrange(len(lines) + 1), lines[i])
        elif kind == "delete":
            closed = _closed(lines)
            gone = lines.pop(i)
            t = _type(gone)
            # a gap in seq, or a closed stream cut short; the last line of a stream that was never
            # closed (its process died) is gone without a trace: as if the process died a line earlier;
            # a duplicated line deleted loses nothing
            if t is not None and (closed or i < len(lines)) and gone not in lines:
                case.lossy.append(f"deleted a {t} line")
        elif kind == "truncate" and _closed(lines):
            keep = rng.randrange(len(lines))
            del lines[keep:]
            case.lossy.append(f"cut {name} after line {keep}")
        elif kind == "forge":
            try:
                evs = [json.loads(x) for x in lines]
            except (ValueError, RecursionError):
                continue
            picks = [k for k, e in enumerate(evs) if isinstance(e, dict) and e.get("type") in EVIDENCE]
            if not picks:
                continue
            t = evs.pop(rng.choice(picks))["type"]
            for seq, e in enumerate(evs):
                if isinstance(e, dict):
                    e["seq"] = seq
                    if e.get("type") == "log_closed":
                        e["lines"] = seq
            case.files[name] = [json.dumps(e, separators=(",", ":")).encode() for e in evs]
            case.lossy.append(f"deleted a {t} line and renumbered seq")
        elif kind == "drop_file":
            types = {_type(x) for x in case.files.pop(name)}
            if types & EVIDENCE:
                case.lossy.append(f"removed {name}")
    return case


def write_case(case: Case, out: Path, rng: random.Random) -> list[str]:
    """Write the case as per-process files, or shuffled into 1-3 files (some gzipped)."""
    out.mkdir(parents=True)
    if rng.random() < 0.5:
        for name, lines in case.files.items():
            (out / name).write_bytes(b"".join(x + b"\n" for x in lines))
        return [str(out)]
    pool = [x for lines in case.files.values() for x in lines]
    rng.shuffle(pool)
    parts = rng.randint(1, 3)
    paths = []
    for k in range(parts):
        data = b"".join(x + b"\n" for x in pool[k::parts])
        path = out / f"part{k}.jsonl"
        path.write_bytes(gzip.compress(data) if rng.random() < 0.3 else data)
        paths.append(str(path))
    return paths


def _alarm(signum: int, frame: Any) -> None:
    raise TimeoutError(f"analyze-events ran over {TIMEOUT_S}s")


def test_mutated_logs_in_process(bases, tmp_path, capsys):
    rng = random.Random(SEED)
    failures, lossy = [], 0
    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        for n in range(CASES):
            case = mutate(bases[n % len(bases)], rng)
            paths = write_case(case, tmp_path / f"case{n}", rng)
            signal.alarm(TIMEOUT_S)
            try:
                code = cli.main(["analyze", *paths, "--format", "json"])
            finally:
                signal.alarm(0)
            capsys.readouterr()
            lossy += bool(case.lossy)
            if code not in (0, 1, 2) or (case.lossy and code != 1):
                failures.append((n, code, case.notes, case.lossy, paths))
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert not failures, f"{len(failures)} of {CASES} cases broke the contract, e.g. {failures[:5]}"
    assert lossy >= CASES // 5  # the generator does produce lossy logs


def test_mutated_logs_in_subprocesses(bases, tmp_path):
    rng = random.Random(SEED + 1)
    for n in range(SUBPROCESS_CASES):
        case = mutate(bases[n % len(bases)], rng)
        if n % 2 == 0:  # the inputs most likely to reach a C extension's limits
            case.files["deep.jsonl"] = [b'{"a":' * 100_000 + b"}" * 100_000, b"[" * 200_000]
        paths = write_case(case, tmp_path / f"case{n}", rng)
        proc = subprocess.run(
            [sys.executable, "-m", "ftkit", "analyze", *paths, "--format", "json"],
            capture_output=True,
            timeout=TIMEOUT_S * 4,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert proc.returncode in (0, 1, 2), (n, proc.returncode, case.notes, proc.stderr[-2000:])
        assert not case.lossy or proc.returncode == 1, (n, case.notes, case.lossy)
        if proc.returncode != 2:
            json.loads(proc.stdout)  # stdout stays one JSON document
