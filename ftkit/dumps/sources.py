"""Find and validate what a path holds: a run directory, a dump tree, safetensors files.

``open_source(path)`` classifies ``path`` and reads every index and safetensors header in it
(validated by ``ftkit.tensors.st.read_header``; no tensor data is read):

- ``run``: a directory with ``run.json``, ``events/`` or ``dumps/``. Its ``dumps/`` tree gives
  dump entries; every other ``*.safetensors`` below it (rollouts/, final/, ...) is a plain file
  keyed by its relative path (the files of ``final/``, one per TP/PP rank, pair as one group by
  tensor name, their TP shards described by the ``sharding`` metadata key that
  ``ftkit.train.rank.state.save_final`` writes, read into ``Source.shardings``), except under
  ``checkpoints/``: which checkpoints a run holds
  depends on its non-finite guard (a faulted interval publishes none), and what they hold is
  the state ``final/`` and the dumps already show; compare two checkpoint directories
  directly, and check them with ``ftkit verify-checkpoint``.
- ``dumps``: a directory with ``*.index.json`` files below it (a dumps root, a prefix, a phase
  or a rollout directory).
- ``files``: any other directory; its ``*.safetensors`` files pair by relative path.
- ``file``: a single ``.safetensors`` file.

Hidden names (temp files of interrupted writes) are ignored; symlinked directories are not
followed, and one that leaves the tree (at any level: a run's ``dumps/`` linked to another
run's) is an ``InputError``. A malformed index, a header that lies, or an index that disagrees with its data
file raises ``InputError`` (exit 2).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftkit.dumps.layout import DATA_SUFFIX, INDEX_SCHEMA, INDEX_SUFFIX, INDEX_VERSION, KINDS, kind_of
from ftkit.dumps.tree import TreeWalker
from ftkit.errors import InputError, UsageError
from ftkit.tensors.sharding import Sharding
from ftkit.tensors.st import Header, TensorInfo, read_header
from ftkit.tensors.untrusted import is_text, load_json, open_regular, short_repr

RUN_MARKERS = ("run.json", "events", "dumps")
_MAX_INDEX = 256 << 20  # an index (or run.json) larger than this is not one ftkit wrote


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
    def key(self) -> tuple[Any, ...]:
        return (self.prefix, self.phase, self.rollout, self.step, self.micro_shard, self.name)


@dataclass
class Source:
    root: Path
    kind: str  # "run" | "dumps" | "files" | "file"
    entries: list[DumpEntry] = field(default_factory=list)
    rollouts: set[tuple[str, str, int]] = field(default_factory=set)
    files: dict[str, Header] = field(default_factory=dict)  # relative path -> header
    orphans: list[str] = field(default_factory=list)  # data files in a dump tree without an index
    skipped: list[str] = field(default_factory=list)  # special files (FIFOs, sockets, devices) not read
    config: dict[str, Any] | None = None  # run.json's "config" (run directories)
    config_missing: str | None = None  # why a run directory's config is unknown ("no run.json", ...)
    shardings: dict[str, dict[str, Sharding]] = field(default_factory=dict)  # final/ file -> split tensors

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


def open_source(path: str | os.PathLike[str], follow_symlinks: bool = False) -> Source:
    """Classify ``path`` and read every header and index in it (see the module docstring).

    Special files (FIFOs, sockets, devices) inside a tree are skipped and listed in
    ``skipped``; as the path itself they are an ``InputError``. A symlink whose target lies
    outside the tree given is an ``InputError`` unless ``follow_symlinks``.
    """
    p = require_exists(path)
    if not p.is_dir():
        if not stat.S_ISREG(p.stat().st_mode):
            raise InputError(f"{p} is not a regular file or a directory", "pass a run directory, dumps or files")
        if not p.name.endswith(DATA_SUFFIX):
            raise InputError(
                f"{p} is not a directory or a .safetensors file",
                "pass a run directory, a dump directory or safetensors files",
            )
        return Source(p, "file", files={"": read_header(p)})  # two single files pair whatever their names
    walker = TreeWalker(p, follow_symlinks)
    if any(os.path.lexists(p / m) for m in RUN_MARKERS):
        src = Source(p, "run", config=_run_config(p / "run.json", walker))
        if src.config is None:
            src.config_missing = (
                "records no config in its run.json" if os.path.lexists(p / "run.json") else "has no run.json"
            )
        dumps = p / "dumps"
        if walker.subdir(dumps):
            _read_dump_tree(dumps, src, walker)
        for rel in walker.files(p, DATA_SUFFIX, skip=(dumps, p / "checkpoints")):
            src.files[rel] = read_header(p / rel)
            if file_group(rel) == FINAL_GROUP:
                src.shardings[rel] = _final_shardings(src.files[rel])
    else:
        indexes = walker.files(p, INDEX_SUFFIX)
        src = Source(p, "dumps" if indexes else "files")
        if indexes:
            _read_dump_tree(p, src, walker)
        else:
            for rel in walker.files(p, DATA_SUFFIX):
                src.files[rel] = read_header(p / rel)
    src.skipped = sorted(set(walker.skipped))
    return src


FINAL_GROUP = "final"


def file_group(rel: str) -> str:
    """The pairing group of a run's plain file: ``final`` for the final state files (one per
    TP/PP rank, paired by tensor name across files), else the relative path itself."""
    return FINAL_GROUP if rel.startswith(f"{FINAL_GROUP}/") else rel


def _final_shardings(header: Header) -> dict[str, Sharding]:
    """``{tensor: Sharding}`` of a final state file's TP split tensors (metadata ``sharding``)."""
    raw = header.metadata.get("sharding")
    if raw is None:
        return {}
    bad = "its 'sharding' metadata is not {tensor: sharding} over its own tensors"
    try:
        doc = load_json(raw.encode())
        if not isinstance(doc, dict):
            raise ValueError("not an object")
        out: dict[str, Sharding] = {}
        for name, value in doc.items():
            if name not in header.tensors or not isinstance(value, dict):
                raise ValueError(f"entry {short_repr(name)}")
            out[name] = Sharding.from_dict(value)
    except (TypeError, ValueError) as exc:
        raise InputError(f"malformed final state {header.path}: {bad} ({exc})", "re-create it (re-run)") from exc
    return out


def _run_config(path: Path, walker: TreeWalker) -> dict[str, Any] | None:
    """``config`` of a run directory's ``run.json`` (``None`` when absent or without one)."""
    if not os.path.lexists(path) or not walker.check(path):
        return None
    try:
        with open_regular(path) as fh:
            doc = load_json(fh.read(_MAX_INDEX))
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}", "check the path and permissions") from exc
    except ValueError as exc:
        raise InputError(f"malformed {path}: {exc}", "the run directory is corrupt; re-create it") from exc
    config = doc.get("config") if isinstance(doc, dict) else None
    return config if isinstance(config, dict) else None


def _read_dump_tree(root: Path, src: Source, walker: TreeWalker) -> None:
    indexed: set[str] = set()
    for rel in walker.files(root, INDEX_SUFFIX):
        data_rel = _read_index(root / rel, src, walker)
        indexed.add((Path(rel).parent / data_rel).as_posix())
    src.orphans.extend(rel for rel in walker.files(root, DATA_SUFFIX) if rel not in indexed)


def _read_index(path: Path, src: Source, walker: TreeWalker) -> str:
    """Parse one writer index, validate it against its data file, add its entries to ``src``;
    returns the data file's name."""
    try:
        with open_regular(path) as fh:
            raw = fh.read(_MAX_INDEX + 1)
        if len(raw) > _MAX_INDEX:
            raise _bad(path, f"larger than {_MAX_INDEX >> 20} MiB")
        doc = load_json(raw)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}", "check the path and permissions") from exc
    except ValueError as exc:
        raise _bad(path, f"not valid JSON ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("schema") != INDEX_SCHEMA:
        raise _bad(path, f"not an ftkit dump index (schema must be {INDEX_SCHEMA!r})")
    version = doc.get("schema_version")
    if type(version) is not int or version != INDEX_VERSION:
        raise InputError(
            f"dump index {path} has schema_version {short_repr(version)}; this ftkit reads version {INDEX_VERSION}",
            "use the ftkit version that wrote the dump",
        )
    try:
        prefix, phase, writer = (_str(doc, k) for k in ("prefix", "phase", "writer"))
        rollout, file_name, cell = _int(doc, "rollout"), _str(doc, "file"), doc.get("cell")
        tensors = doc["tensors"]
        if "/" in file_name or file_name in ("", ".", "..") or not isinstance(tensors, list):
            raise ValueError("'file' must be a file name and 'tensors' a list")
        if cell is not None and type(cell) is not int:
            raise ValueError(f"'cell' must be an integer or null, not {short_repr(cell)}")
    except (KeyError, TypeError, ValueError) as exc:
        raise _bad(path, f"missing or invalid field: {exc}") from exc
    data = path.parent / file_name
    if not os.path.lexists(data) or not walker.check(data):
        raise _bad(path, f"its data file {file_name} is missing or not a regular file")
    header = read_header(data)
    file_bytes = doc.get("file_bytes")
    if file_bytes is not None and (type(file_bytes) is not int or file_bytes != header.size):
        raise _bad(path, f"records {short_repr(file_bytes)} bytes but {file_name} has {header.size}")
    src.rollouts.add((prefix, phase, rollout))
    seen: set[tuple[Any, ...]] = set()
    for i, t in enumerate(tensors):
        e = _entry(path, i, t, header, prefix, phase, rollout, writer, cell)
        for what, key in (("key", e.ref.info.name), ("tensor", e.key)):
            if (what, key) in seen:
                raise _bad(path, f"tensor entry {i} repeats {what} {short_repr(key)} (each tensor once per index)")
            seen.add((what, key))
        src.entries.append(e)
    unlisted = sorted(set(header.tensors) - {key for what, key in seen if what == "key"})
    if unlisted:
        raise _bad(path, f"{file_name} holds tensor(s) the index does not list: {short_repr(unlisted)}")
    return file_name


def _entry(
    path: Path, i: int, t: Any, header: Header, prefix: str, phase: str, rollout: int, writer: str, cell: Any
) -> DumpEntry:
    try:
        if not isinstance(t, dict):
            raise TypeError("not an object")
        name, key = _str(t, "name"), _str(t, "key")
        ms = None if t.get("micro_shard") is None else _int(t, "micro_shard")
        step, order = _int(t, "step"), _int(t, "order") if "order" in t else i
        raw_sharding = t.get("sharding") or {}
        if not isinstance(raw_sharding, dict):
            raise TypeError("'sharding' must be an object")
        sharding = Sharding.from_dict(raw_sharding)
        dtype, shape = _str(t, "dtype"), t["shape"]
        if not isinstance(shape, list) or not all(type(d) is int for d in shape):
            raise ValueError(f"'shape' must be a list of integers, not {short_repr(shape)}")
        fp = t.get("fingerprint")
        if fp is not None and not (isinstance(fp, str) and is_text(fp)):
            raise TypeError(f"'fingerprint' must be a string, not {short_repr(fp)}")
        kind = t.get("kind") or kind_of(name)
        if kind not in (*KINDS, "tensor"):
            raise ValueError(f"'kind' must be one of {', '.join((*KINDS, 'tensor'))}, not {short_repr(kind)}")
        nonfinite = (_int(t, "nan"), _int(t, "inf")) if "nan" in t and "inf" in t and fp else None
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise _bad(path, f"tensor entry {i}: missing or invalid field ({exc})") from exc
    info = header.tensors.get(key)
    if info is None:
        raise _bad(path, f"tensor {short_repr(name)} (key {short_repr(key)}) is not in {header.path.name}")
    if (info.dtype, info.shape) != (dtype, tuple(shape)):
        raise _bad(
            path,
            f"tensor {short_repr(name)}: index says {short_repr(dtype)}{short_repr(shape)}, "
            f"file has {info.dtype}{list(info.shape)}",
        )
    return DumpEntry(
        prefix,
        phase,
        rollout,
        step,
        ms,
        name,
        kind,
        order,
        writer,
        cell,
        sharding,
        TensorRef(header.path, info, fp, nonfinite),
    )


def _str(doc: dict[str, Any], key: str) -> str:
    v = doc[key]
    if not isinstance(v, str) or not is_text(v):
        raise TypeError(f"{key!r} must be a string of valid Unicode text, not {short_repr(v)}")
    return v


def _int(doc: dict[str, Any], key: str) -> int:
    """A non-negative JSON integer (not a float such as 1e999, not a bool, not huge)."""
    v = doc[key]
    if type(v) is not int or not 0 <= v < 1 << 62:
        raise ValueError(f"{key!r} must be a non-negative integer, not {short_repr(v)}")
    return v


def _bad(path: Path, what: str) -> InputError:
    return InputError(f"malformed dump index {path}: {what}", "the dump is corrupt; re-create it (re-run the dump)")


# run.json "config" fields that decide which tensors a run holds and their shapes (and the
# data itself): runs that differ here cannot compare tensor for tensor. Cells, TP, PP, the
# reduction and the dump settings are not among them (I3: results do not depend on them).
# They are the fields of the config sections placed with ``pairs_dumps``
# (``ftkit.train.config.places.DATA_SHAPING``); dumps/ sits below train/ and does not import
# it, so tests/train/test_config_places.py holds this copy equal to the derived one.
DATA_SHAPING = (
    "model",
    "model_digest",
    "samples_per_rollout",
    "steps_per_rollout",
    "micro_shards",
    "group_size",
    "response_len",
    "prompts",
    "prompts_digest",
    "input_key",
    "label_key",
    "max_prompt_len",
    "reward",
    "seed",
    "rollouts",
)

#: The value of a field a record made before the field existed stands for (``model_digest``:
#: such runs trained a preset, whose digest is empty; the prompt fields: such runs trained the
#: addition task, and their defaults).
RECORDED_BEFORE: dict[str, Any] = {
    "model_digest": "",
    "prompts": None,
    "prompts_digest": "",
    "input_key": "prompt",
    "label_key": "answer",
    "max_prompt_len": 64,
}


def config_diff(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, tuple[Any, Any]]:
    """``{field: (value in A, value in B)}`` for the ``DATA_SHAPING`` fields that differ
    (both configs known; a field missing on one side differs, unless ``RECORDED_BEFORE`` gives
    the value its absence stands for)."""
    if a is None or b is None:
        return {}
    a, b = {**RECORDED_BEFORE, **a}, {**RECORDED_BEFORE, **b}
    return {k: (a.get(k), b.get(k)) for k in DATA_SHAPING if a.get(k) != b.get(k)}


_KIND_NAMES = {
    "run": "a run directory",
    "dumps": "a dump directory",
    "files": "a directory of .safetensors files",
    "file": "a single file",
}


def check_compatible(a: Source, b: Source) -> None:
    """Both sides must be the same kind of thing, and not both empty (fail closed)."""
    if a.kind != b.kind:
        raise UsageError(
            f"cannot compare {_KIND_NAMES.get(a.kind, a.kind)} ({a.root}) "
            f"with {_KIND_NAMES.get(b.kind, b.kind)} ({b.root})",
            "pass two run directories, two dump directories, two plain directories or two files",
        )
    if a.empty and b.empty:
        raise InputError(
            f"nothing to compare: no dumps or safetensors files in {a.root} or {b.root}",
            "check the paths; a run directory holds dumps/ only when it was trained with dumps on",
        )
