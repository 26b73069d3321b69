"""Safetensors helpers: atomic writes and a header reader that trusts nothing.

Writing: ``write_safetensors_atomic`` serialises with the safetensors library inside a hidden
staging directory next to the destination (safetensors makes its own temp file next to
the file it writes, so that one stays contained too), fsyncs, renames the file over the
destination, fsyncs the directory and removes the staging directory: a reader sees the old
file or the complete new one, never a partial one. A process killed mid-write leaves only
a hidden ``.NAME.tmp-HOST-PID-RAND`` file or directory, which ``remove_stale_temps`` of the
same writer later deletes.

Reading: ``read_header`` validates a file before anything else touches it (length prefix,
JSON, known dtypes, shapes, offsets that tile the data area exactly and match
dtype x shape, file size) and raises ``ftkit.errors.InputError`` with one clear line.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import socket
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from ftkit.errors import InputError
from ftkit.fsutil import TMP_MARK, fsync_dir, pid_alive, temp_path
from ftkit.tensors.untrusted import is_text, load_json, open_regular, short_repr

if TYPE_CHECKING:  # pragma: no cover
    import torch

# safetensors dtype code -> (torch dtype name, bytes per element); what safetensors can load.
ST_DTYPES: dict[str, tuple[str, int]] = {
    "BOOL": ("bool", 1),
    "U8": ("uint8", 1),
    "I8": ("int8", 1),
    "I16": ("int16", 2),
    "U16": ("uint16", 2),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "I32": ("int32", 4),
    "U32": ("uint32", 4),
    "F32": ("float32", 4),
    "I64": ("int64", 8),
    "U64": ("uint64", 8),
    "F64": ("float64", 8),
    "C64": ("complex64", 8),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2": ("float8_e5m2", 1),
    "F8_E4M3FNUZ": ("float8_e4m3fnuz", 1),
    "F8_E5M2FNUZ": ("float8_e5m2fnuz", 1),
    "F8_E8M0": ("float8_e8m0fnu", 1),  # MX block scales: 2^(e-127), 0xFF is NaN, no zero or inf
}
TORCH_TO_ST = {name: code for code, (name, _) in ST_DTYPES.items()}
# Valid in the safetensors format (0.6+) but not read by ftkit (sub-byte, packed): a clear "not
# supported", not "corrupt".
SPEC_ONLY_DTYPES = frozenset(["F4", "F6_E2M3", "F6_E3M2"])
_MAX_HEADER = 100 << 20
_MAX_DIMS = 64


@contextlib.contextmanager
def staging_dir(target: Path) -> Iterator[Path]:
    """A hidden directory next to ``target`` (named like its temps), removed on exit."""
    stage = temp_path(target)
    stage.mkdir()
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def remove_stale_temps(target: Path) -> list[Path]:
    """Delete temp files and staging directories of ``target`` left by dead processes of this
    host; returns them.

    Only temps named for ``target`` are considered, and only those whose recorded pid is no
    longer running here; temps of live processes or of other hosts are left alone.
    """
    host = socket.gethostname().replace("-", "_") or "host"
    removed = []
    for p in target.parent.glob(f".{target.name}{TMP_MARK}*"):
        parts = p.name[len(target.name) + 1 + len(TMP_MARK) :].split("-")
        if len(parts) != 3 or parts[0] != host or not parts[1].isdigit():
            continue
        if pid_alive(int(parts[1])):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p)
    return removed
    return True


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> int:
    """Write ``data`` to ``path`` atomically (temp in the same dir, fsync, rename, fsync dir)."""
    target = Path(path)
    tmp = temp_path(target)
    try:
        write_durable(tmp, data)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)
    return len(data)


def write_durable(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync it (no rename; for temp files)."""
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def save_safetensors(
    path: str | os.PathLike[str], tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> int:
    """Serialise ``tensors`` into ``path`` (no rename) and fsync it; returns the file size.

    Write into a ``staging_dir``: safetensors creates its own temp file next to ``path``.
    Tensors may live on any device and have any strides (they are made contiguous on CPU).
    Raises ``ValueError`` for a dtype safetensors cannot load back (see ``ST_DTYPES``).
    No pickle is involved at any point.
    """
    from safetensors.torch import save_file

    from ftkit.tensors.fingerprint import dtype_name

    host = {}
    for name, t in tensors.items():
        if dtype_name(t.dtype) not in TORCH_TO_ST:
            raise ValueError(f"tensor {name!r}: dtype {t.dtype} cannot be stored in safetensors")
        host[name] = t.detach().to("cpu").contiguous()
    save_file(host, str(path), metadata=dict(metadata) if metadata else None)
    with open(path, "rb+") as fh:
        if metadata:
            _sort_metadata(fh)
        os.fsync(fh.fileno())
    return Path(path).stat().st_size


def _sort_metadata(fh: BinaryIO) -> None:
    """Rewrite the header of the safetensors file open in ``fh`` in place with its
    ``__metadata__`` keys sorted, so files that hold the same state are the same bytes (the Rust
    writer keeps metadata in a HashMap: its order changes from process to process). Only when
    re-serialising the parsed header gives back its exact bytes (then the sorted one has the same
    length and nothing else moves); otherwise the file is left as written."""
    import json

    fh.seek(0)
    head = fh.read(8)
    if len(head) != 8:
        return
    (n,) = struct.unpack("<Q", head)
    raw = fh.read(n)
    if len(raw) != n:
        return
    text = raw.rstrip(b" ")
    try:
        header = json.loads(text)
    except ValueError:
        return
    if not isinstance(header, dict) or not isinstance(header.get("__metadata__"), dict):
        return

    def dump(obj: object) -> bytes:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()

    if dump(header) != text:
        return
    ordered = {k: (dict(sorted(v.items())) if k == "__metadata__" else v) for k, v in header.items()}
    new = dump(ordered)
    if len(new) == len(text) and new != text:
        fh.seek(8)
        fh.write(new)
        fh.flush()


def write_safetensors_atomic(
    path: str | os.PathLike[str], tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> int:
    """Write ``tensors`` as a safetensors file at ``path`` atomically; returns the file size.

    ``save_safetensors`` into a staging directory next to ``path``, rename over ``path``,
    fsync the directory: readers see the old file or the complete new one.
    """
    target = Path(path)
    with staging_dir(target) as stage:
        size = save_safetensors(stage / target.name, tensors, metadata)
        os.replace(stage / target.name, target)
    fsync_dir(target.parent)
    return size


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a validated safetensors header; offsets are absolute file offsets."""

    name: str
    code: str  # safetensors dtype code, e.g. "BF16"
    dtype: str  # torch dtype name, e.g. "bfloat16"
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class Header:
    """A validated safetensors header: tensors in file-offset order, metadata, sizes."""

    path: Path
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str] = field(default_factory=dict)
    data_start: int = 0
    size: int = 0


def read_header(path: str | os.PathLike[str]) -> Header:
    """Read and validate the header of a safetensors file; ``InputError`` if it is malformed.

    Never blocks on a FIFO or device (``open_regular``), never recurses on nested JSON.
    """
    p = Path(path)
    try:
        with open_regular(p) as fh:
            size = os.fstat(fh.fileno()).st_size
            prefix = fh.read(8)
            if len(prefix) < 8:
                raise _bad(p, f"truncated: {size} bytes, not even the 8-byte header length")
            (n,) = struct.unpack("<Q", prefix)
            if n > _MAX_HEADER or 8 + n > size:
                raise _bad(p, f"header length {n} exceeds the file size {size} (truncated or not safetensors)")
            raw = fh.read(n)
    except OSError as exc:
        raise InputError(f"cannot read {p}: {exc.strerror or exc}", "check the path and permissions") from exc
    try:
        doc = load_json(raw)
    except ValueError as exc:
        raise _bad(p, f"header is not valid JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise _bad(p, "header is not a JSON object")
    meta = doc.pop("__metadata__", {})  # absent, or an object of strings: null and [] are not
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise _bad(p, "__metadata__ must be absent or an object mapping strings to strings")
    for text in (*doc, *meta, *meta.values()):
        if not is_text(text):
            raise _bad(p, f"{short_repr(text)} is not valid Unicode text (a lone surrogate)")
    data_start = 8 + n
    infos = [_entry(p, name, spec, data_start) for name, spec in doc.items()]
    infos.sort(key=lambda i: (i.start, i.end))
    pos = data_start
    for info in infos:
        if info.start != pos:
            raise _bad(
                p,
                f"tensor {info.name!r}: data offsets overlap or leave a gap "
                f"(start {info.start - data_start}, expected {pos - data_start})",
            )
        pos = info.end
    if pos != size:
        what = "truncated" if pos > size else "has trailing bytes"
        raise _bad(p, f"{what}: header describes {pos} bytes, file has {size}")
    return Header(p, {i.name: i for i in infos}, dict(meta), data_start, size)


def _entry(p: Path, name: str, spec: object, data_start: int) -> TensorInfo:
    if not isinstance(spec, dict):
        raise _bad(p, f"tensor {name!r}: entry is not an object")
    code = spec.get("dtype")
    if isinstance(code, str) and code in SPEC_ONLY_DTYPES:
        raise InputError(
            f"{p}: tensor {name!r} has dtype {code}, which ftkit does not read (sub-byte formats)",
            f"ftkit reads {', '.join(ST_DTYPES)}; convert the tensor (e.g. to BF16) or leave the file out",
        )
    if not isinstance(code, str) or code not in ST_DTYPES:
        raise _bad(p, f"tensor {name!r}: unsupported dtype {short_repr(code)}")
    shape, offsets = spec.get("shape"), spec.get("data_offsets")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise _bad(p, f"tensor {name!r}: shape {short_repr(shape)} is not a list of non-negative integers")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise _bad(p, f"tensor {name!r}: data_offsets {short_repr(offsets)} are not [begin, end]")
    dtype, itemsize = ST_DTYPES[code]
    if len(shape) > _MAX_DIMS:
        raise _bad(p, f"tensor {name!r}: {len(shape)} dimensions (at most {_MAX_DIMS})")
    numel = 1
    for d in shape:
        numel *= d
        if numel > offsets[1]:  # bigger than the file can hold: stop before the product grows huge
            break
    if offsets[1] - offsets[0] != numel * itemsize:
        needs = "more" if numel > offsets[1] else str(numel * itemsize)
        raise _bad(
            p,
            f"tensor {name!r}: data_offsets span {offsets[1] - offsets[0]} bytes, "
            f"{code}{short_repr(shape)} needs {needs}",
        )
    return TensorInfo(name, code, dtype, tuple(shape), data_start + offsets[0], data_start + offsets[1])


def _bad(p: Path, what: str) -> InputError:
    return InputError(
        f"malformed safetensors file {p}: {what}",
        "the file is corrupt or truncated; re-create it (e.g. re-run the dump)",
    )
