"""Seeded mutators of safetensors files and dump trees, for the randomised CLI suite.

``mutate_tree(root, rng)`` applies one to three random mutations to the dump tree or plain
file tree under ``root`` and returns their descriptions. Mutations cover the classes of
issue 9: hostile JSON values in headers and indexes (wrong types, huge and non-finite
numbers, deep nesting, duplicates, missing keys), length prefixes and offsets that lie,
truncation, flipped and appended bytes, invalid UTF-8, deleted or renamed files, FIFOs, and
symlinks that leave the tree.
"""

from __future__ import annotations

import json
import os
import random
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

HOSTILE: list[Any] = [
    None,
    True,
    -1,
    0,
    2**64,
    10**40,
    1.5,
    float("inf"),
    "",
    "F32",
    "BF16",
    "x" * 300,
    [],
    [1, 2],
    [[1]],
    {},
    {"a": 1},
    "\u202e\n::error::x",
]
RAW_HOSTILE = ["1e999", "-1e999", "NaN", "9" * 5000, "9" * 200, "[" * 2000 + "]" * 2000, '"\\ud800"']


def _files(root: Path, suffix: str) -> list[Path]:
    return sorted(p for p in root.rglob(f"*{suffix}") if p.is_file() and not p.is_symlink())


def _split(path: Path) -> tuple[dict[str, Any], bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _join(path: Path, header: bytes, data: bytes, length: int | None = None) -> None:
    path.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + data)


def _poke(doc: Any, rng: random.Random) -> tuple[Any, str]:
    """Replace, delete or duplicate one value at a random place in a JSON document."""
    path: list[Any] = []
    node = doc
    while isinstance(node, (dict, list)) and node and rng.random() < 0.75:
        key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
        path.append(key)
        parent, node = node, node[key]
    if not path:
        return rng.choice(HOSTILE), "replaced the whole document"
    op = rng.choice(["set", "set", "set", "delete", "dup"])
    key = path[-1]
    if op == "delete" and isinstance(parent, dict):
        del parent[key]
    elif op == "dup" and isinstance(parent, list):
        parent.append(json.loads(json.dumps(parent[key])))
    else:
        parent[key] = rng.choice(HOSTILE)
    return doc, f"{op} at {path}"


def _raw_poke(text: str, rng: random.Random) -> str:
    """Replace one JSON number or string literal by a raw hostile token."""
    spots = [i for i, c in enumerate(text) if c in '0123456789"']
    if not spots:
        return text
    i = rng.choice(spots)
    j = i + 1
    while j < len(text) and text[j] not in ",]}\n":
        j += 1
    return text[:i] + rng.choice(RAW_HOSTILE) + text[j:]


def header_value(root: Path, rng: random.Random) -> str:
    path = rng.choice(_files(root, ".safetensors"))
    header, data = _split(path)
    header, what = _poke(header, rng)
    _join(path, json.dumps(header).encode(), data)
    return f"header {path.name}: {what}"


def header_raw(root: Path, rng: random.Random) -> str:
    path = rng.choice(_files(root, ".safetensors"))
    header, data = _split(path)
    _join(path, _raw_poke(json.dumps(header), rng).encode(), data)
    return f"header {path.name}: raw token"


def header_length(root: Path, rng: random.Random) -> str:
    path = rng.choice(_files(root, ".safetensors"))
    header, data = _split(path)
    body = json.dumps(header).encode()
    lie = rng.choice([0, 1, len(body) - 1, len(body) + 1, 2**63, 2**64 - 1, 100 << 20])
    _join(path, body, data, lie)
    return f"header {path.name}: length prefix {lie}"


def truncate(root: Path, rng: random.Random) -> str:
    path = rng.choice(_files(root, ".safetensors") + _files(root, ".json"))
    size = path.stat().st_size
    cut = rng.randrange(size + 1)
    with open(path, "r+b") as fh:
        fh.truncate(cut)
    return f"truncated {path.name} to {cut} of {size}"


def flip(root: Path, rng: random.Random) -> str:
    path = rng.choice(_files(root, ".safetensors") + _files(root, ".json"))
    raw = bytearray(path.read_bytes())
    if not raw:
        return "flip: empty"
    for _ in range(rng.randint(1, 4)):
        raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(raw))
    return f"flipped bits in {path.name}"


def append(root: Path, rng: random.Random) -> str:
    path = rng.choice(_files(root, ".safetensors") + _files(root, ".json"))
    with open(path, "ab") as fh:
        fh.write(rng.choice([b"\0", b"\xff\xfe", b"x" * 1000, b"{}"]))
    return f"appended to {path.name}"


def index_value(root: Path, rng: random.Random) -> str:
    indexes = _files(root, ".index.json")
    if not indexes:
        return header_value(root, rng)
    path = rng.choice(indexes)
    doc, what = _poke(json.loads(path.read_text()), rng)
    path.write_text(json.dumps(doc))
    return f"index {path.name}: {what}"


def index_raw(root: Path, rng: random.Random) -> str:
    indexes = _files(root, ".index.json")
    if not indexes:
        return header_raw(root, rng)
    path = rng.choice(indexes)
    path.write_text(_raw_poke(path.read_text(), rng))
    return f"index {path.name}: raw token"


def index_bytes(root: Path, rng: random.Random) -> str:
    indexes = _files(root, ".index.json")
    if not indexes:
        return flip(root, rng)
    path = rng.choice(indexes)
    path.write_bytes(rng.choice([b"\xff\xfe\x00", b"[" * 100_000, b"", b"null", b"1e999", b'{"schema": 1}']))
    return f"index {path.name}: replaced bytes"


def remove(root: Path, rng: random.Random) -> str:
    path = rng.choice(_files(root, ".safetensors") + _files(root, ".json"))
    path.unlink()
    return f"removed {path.name}"


def special(root: Path, rng: random.Random) -> str:
    parent = rng.choice([p for p in root.rglob("*") if p.is_dir()] + [root])
    name = rng.choice(["fifo.safetensors", "fifo.index.json", "w.safetensors"])
    target = parent / name
    if target.exists():
        target.unlink()
    os.mkfifo(target)
    return f"fifo {target.relative_to(root)}"


def symlink_out(root: Path, rng: random.Random) -> str:
    path = rng.choice(_files(root, ".safetensors"))
    outside = root.parent / f"outside-{rng.randrange(10**9)}.safetensors"
    path.rename(outside)
    path.symlink_to(outside)
    return f"symlinked {path.name} out of the tree"


MUTATORS: list[Callable[[Path, random.Random], str]] = [
    header_value,
    header_value,
    header_raw,
    header_length,
    truncate,
    flip,
    append,
    index_value,
    index_value,
    index_raw,
    index_bytes,
    remove,
    special,
    symlink_out,
]


def mutate_tree(root: Path, rng: random.Random) -> list[str]:
    """Apply one to three random mutations to the tree under ``root``; their descriptions."""
    done = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        try:
            done.append(rng.choice(MUTATORS)(root, rng))
        except (IndexError, ValueError, OSError, struct.error, RecursionError):
            done.append("(mutation not applicable after an earlier one)")
    return done
