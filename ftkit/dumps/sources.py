"""Find and validate what a path holds: a run directory, a dump tree, safetensors files.

``open_source(path)`` classifies ``path`` and reads every index and safetensors header in it
(validated by ``ftkit.tensors.st.read_header``; no tensor data is read):

- ``run``: a directory with ``run.json``, ``events/`` or ``dumps/``. Its ``dumps/`` tree gives
  dump entries; every other ``*.safetensors`` below it (rollouts/, final/, ...) is a plain file
  keyed by its relative path, except under ``checkpoints/``: which checkpoints a run holds
  depends on its non-finite guard (a faulted interval publishes none), and what they hold is
  the state ``final/`` and the dumps already show; compare two checkpoint directories
  directly, and check them with ``ftkit verify-checkpoint``.
- ``dumps``: a directory with ``*.index.json`` files below it (a dumps root, a prefix, a phase
  or a rollout directory).
- ``files``: any other directory; its ``*.safetensors`` files pair by relative path.
- ``file``: a single ``.safetensors`` file.

Hidden names (temp files of interrupted writes) are ignored; symlinked directories are not
followed. A malformed index, a header that lies, or an index that disagrees with its data
file raises ``InputError`` (exit 2).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftkit.dumps.layout import DATA_SUFFIX, INDEX_SCHEMA, INDEX_SUFFIX, INDEX_VERSION, kind_of
from ftkit.errors import InputError, UsageError
from ftkit.tensors.sharding import Sharding
from ftkit.tensors.st import Header, TensorInfo, read_header

RUN_MARKERS = ("run.json", "events", "dumps")


@dataclass(frozen=True)
class TensorRef:
    """Where one stored tensor lives and what its header says."""

    file: Path
    info: TensorInfo
    fingerprint: str | None = None  # from a dump index; None for plain files
    nonfinite: tuple[int, int] | None = None  # (NaN, Inf) counts from a dump index


@dataclass(frozen=True)
class DumpEntry:
    """One tensor of one dump writer, with its pairing key."""

    prefix: str
    phase: str
    rollout: int
    step: int
    micro_shard: int | None
    name: str
    kind: str
    order: int  # capture order inside its writer
    writer: str
    cell: Any
    sharding: Sharding
    ref: TensorRef

    @property
    def key(self) -> tuple:
        return (self.prefix, self.phase, self.rollout, self.step, self.micro_shard, self.name)


@dataclass
class Source:
    root: Path
    kind: str  # "run" | "dumps" | "files" | "file"
    entries: list[DumpEntry] = field(default_factory=list)
    rollouts: set[tuple[str, str, int]] = field(default_factory=set)
    files: dict[str, Header] = field(default_factory=dict)  # relative path -> header
    orphans: list[str] = field(default_factory=list)  # data files in a dump tree without an index

    @property
    def empty(self) -> bool:
        return not (self.entries or self.rollouts or self.files or self.orphans)

    def total_bytes(self) -> int:
        return sum(e.ref.info.nbytes for e in self.entries) + sum(h.size for h in self.files.values())


def require_exists(path: str | os.PathLike[str]) -> Path:
    """``path`` as a ``Path``; ``InputError`` when it does not exist."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p} does not exist", "pass a run directory, a dump directory or safetensors files")
    return p


def open_source(path: str | os.PathLike[str]) -> Source:
    p = require_exists(path)
    if p.is_file():
        if not p.name.endswith(DATA_SUFFIX):
            raise InputError(
                f"{p} is not a directory or a .safetensors file",
                "pass a run directory, a dump directory or safetensors files",
            )
        return Source(p, "file", files={"": read_header(p)})  # two single files pair whatever their names
    if any((p / m).exists() for m in RUN_MARKERS):
        src = Source(p, "run")
        dumps = p / "dumps"
        if dumps.is_dir():
            _read_dump_tree(dumps, src)
        for rel in _walk(p, DATA_SUFFIX, skip=(dumps, p / "checkpoints")):
            src.files[rel] = read_header(p / rel)
        return src
    indexes = _walk(p, INDEX_SUFFIX)
    if indexes:
        src = Source(p, "dumps")
        _read_dump_tree(p, src)
        return src
    src = Source(p, "files")
    for rel in _walk(p, DATA_SUFFIX):
        src.files[rel] = read_header(p / rel)
    return src


def _walk(root: Path, suffix: str, skip: tuple[Path, ...] = ()) -> list[str]:
    """Relative paths (posix) of non-hidden files ending in ``suffix``, sorted; directories in
    ``skip`` are not entered."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        d = Path(dirpath)
        dirnames[:] = sorted(n for n in dirnames if not n.startswith(".") and d / n not in skip)
        found.extend(
            (d / n).relative_to(root).as_posix() for n in filenames if n.endswith(suffix) and not n.startswith(".")
        )
    return sorted(found)


def _read_dump_tree(root: Path, src: Source) -> None:
    indexed: set[str] = set()
    for rel in _walk(root, INDEX_SUFFIX):
        data_rel = _read_index(root / rel, src)
        indexed.add((Path(rel).parent / data_rel).as_posix())
    src.orphans.extend(rel for rel in _walk(root, DATA_SUFFIX) if rel not in indexed)


def _read_index(path: Path, src: Source) -> str:
    """Parse one writer index, validate it against its data file, add its entries to ``src``;
    returns the data file's name."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}", "check the path and permissions") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _bad(path, f"not valid JSON ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("schema") != INDEX_SCHEMA:
        raise _bad(path, f"not an ftkit dump index (schema must be {INDEX_SCHEMA!r})")
    if doc.get("schema_version") != INDEX_VERSION:
        raise InputError(
            f"dump index {path} has schema_version {doc.get('schema_version')!r}; "
            f"this ftkit reads version {INDEX_VERSION}",
            "use the ftkit version that wrote the dump",
        )
    try:
        prefix, phase, writer = str(doc["prefix"]), str(doc["phase"]), str(doc["writer"])
        rollout, file_name, cell = int(doc["rollout"]), doc["file"], doc.get("cell")
        tensors = doc["tensors"]
        if not isinstance(file_name, str) or "/" in file_name or not isinstance(tensors, list):
            raise ValueError("'file' must be a file name and 'tensors' a list")
    except (KeyError, TypeError, ValueError) as exc:
        raise _bad(path, f"missing or invalid field: {exc}") from exc
    data = path.parent / file_name
    if not data.is_file():
        raise _bad(path, f"its data file {file_name} is missing")
    header = read_header(data)
    if doc.get("file_bytes") not in (None, header.size):
        raise _bad(path, f"records {doc.get('file_bytes')} bytes but {file_name} has {header.size}")
    src.rollouts.add((prefix, phase, rollout))
    for i, t in enumerate(tensors):
        src.entries.append(_entry(path, i, t, header, prefix, phase, rollout, writer, cell))
    return file_name


def _entry(
    path: Path, i: int, t: Any, header: Header, prefix: str, phase: str, rollout: int, writer: str, cell: Any
) -> DumpEntry:
    try:
        name, key = str(t["name"]), str(t["key"])
        ms = t.get("micro_shard")
        sharding = Sharding.from_dict(t.get("sharding") or {})
        step, ms = int(t["step"]), None if ms is None else int(ms)
        dtype, shape, fp, order = (
            t["dtype"],
            tuple(int(d) for d in t["shape"]),
            t.get("fingerprint"),
            int(t.get("order", i)),
        )
        nonfinite = (int(t["nan"]), int(t["inf"])) if "nan" in t and "inf" in t and fp else None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _bad(path, f"tensor entry {i}: missing or invalid field ({exc})") from exc
    info = header.tensors.get(key)
    if info is None:
        raise _bad(path, f"tensor {name!r} (key {key!r}) is not in {header.path.name}")
    if (info.dtype, info.shape) != (dtype, shape):
        raise _bad(path, f"tensor {name!r}: index says {dtype}{list(shape)}, file has {info.dtype}{list(info.shape)}")
    return DumpEntry(
        prefix,
        phase,
        rollout,
        step,
        ms,
        name,
        t.get("kind") or kind_of(name),
        order,
        writer,
        cell,
        sharding,
        TensorRef(header.path, info, fp, nonfinite),
    )


def _bad(path: Path, what: str) -> InputError:
    return InputError(f"malformed dump index {path}: {what}", "the dump is corrupt; re-create it (re-run the dump)")


def check_compatible(a: Source, b: Source) -> None:
    """Both sides must be the same kind of thing, and not both empty (fail closed)."""
    if a.kind != b.kind:
        raise UsageError(
            f"cannot compare a {a.kind} ({a.root}) with a {b.kind} ({b.root})",
            "pass two run directories, two dump directories, two plain directories or two files",
        )
    if a.empty and b.empty:
        raise InputError(
            f"nothing to compare: no dumps or safetensors files in {a.root} or {b.root}",
            "check the paths; a run directory holds dumps/ only when it was trained with dumps on",
        )
