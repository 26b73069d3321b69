"""The wire format between an engine client and its engine server process (a pair of pipes).

A message is one frame: an 8-byte little-endian length and a UTF-8 JSON header, then an
8-byte little-endian length and a payload in the safetensors format (length 0: no tensors).
The header is a JSON object; tensors travel only in the payload, so nothing on the wire is ever
unpickled. Both sides (ftkit's main environment and the engine's virtualenv) import only
this module, ``json``, ``struct`` and torch.

The payload is streamed, never held whole: the writer sends the safetensors header, then each
tensor's bytes straight from the tensor's memory; the reader reads each tensor's bytes straight
into the tensor it returns. A sync of a model's weights therefore costs each side the tensors
themselves and no serialized copy (with ``safetensors.torch.save`` / ``load`` the server held
three copies of the weights at once: the pipe's chunks, their join and the loaded tensors).
The payload is a valid safetensors file: ``safetensors.torch.load(payload)`` reads it.

Contract:

* ``write_frame(f, header, tensors)`` writes one frame and flushes; ``tensors`` may be empty;
  returns the payload's size in bytes.
* ``read_frame(f)`` returns ``(header, tensors)``; at a clean end of stream (the peer exited
  before a new frame) it raises ``EOFError``, and a frame cut short raises ``EOFError`` too
  (the peer died mid-write): a reader never returns a partial message. A payload that is not
  safetensors (a bad header, overlapping or out-of-range offsets, an unknown dtype) is
  ``ValueError``.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

_LEN = struct.Struct("<Q")
#: safetensors dtype names (the format's) of the torch dtypes that cross the pipe.
_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}
_NAMES = {v: k for k, v in _DTYPES.items()}


def _bytes_of(t: torch.Tensor) -> memoryview:
    """The raw bytes of a contiguous CPU tensor, without a copy."""
    import torch

    return t.reshape(-1).view(torch.uint8).numpy().data if t.numel() else memoryview(b"")


def write_frame(f: IO[bytes], header: Mapping[str, Any], tensors: Mapping[str, torch.Tensor] | None = None) -> int:
    """Write one frame (header, then the tensors in the safetensors format) and flush; returns
    the payload's size in bytes."""
    head = json.dumps(dict(header)).encode()
    f.write(_LEN.pack(len(head)))
    f.write(head)
    if not tensors:
        f.write(_LEN.pack(0))
        f.flush()
        return 0
    parts = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    meta: dict[str, Any] = {}
    offset = 0
    for name, t in parts.items():
        dtype = str(t.dtype).rsplit(".", 1)[-1]
        if dtype not in _NAMES:
            raise ValueError(f"{name}: dtype {dtype} cannot cross the engine pipe")
        size = t.numel() * t.element_size()
        meta[name] = {"dtype": _NAMES[dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    st_head = json.dumps(meta, separators=(",", ":")).encode()
    st_head += b" " * (-len(st_head) % 8)  # the tensors' bytes start 8-aligned, as safetensors writes them
    payload = _LEN.size + len(st_head) + offset
    f.write(_LEN.pack(payload))
    f.write(_LEN.pack(len(st_head)))
    f.write(st_head)
    for t in parts.values():
        f.write(_bytes_of(t))
    f.flush()
    return payload


def _read_exact(f: IO[bytes], n: int) -> bytes:
    chunks, left = [], n
    while left:
        got = f.read(left)
        if not got:
            raise EOFError(f"stream ended {left} bytes before the end of a frame")
        chunks.append(got)
        left -= len(got)
    return b"".join(chunks)


def _read_into(f: IO[bytes], buf: memoryview) -> None:
    """Fill ``buf`` from ``f`` (``EOFError`` when the stream ends first)."""
    done = 0
    while done < len(buf):
        got = f.readinto(buf[done:])  # type: ignore[attr-defined]  # a buffered binary stream
        if not got:
            raise EOFError(f"stream ended {len(buf) - done} bytes before the end of a frame")
        done += got


def read_frame(f: IO[bytes]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Read one frame: ``(header, {name: tensor})`` (see the module docstring for EOF)."""
    first = f.read(_LEN.size)
    if not first:
        raise EOFError("stream ended")
    if len(first) < _LEN.size:
        first += _read_exact(f, _LEN.size - len(first))
    header = json.loads(_read_exact(f, _LEN.unpack(first)[0]))
    if not isinstance(header, dict):
        raise ValueError(f"frame header is a {type(header).__name__}, not an object")
    (size,) = _LEN.unpack(_read_exact(f, _LEN.size))
    return header, (_read_tensors(f, size) if size else {})


def _read_tensors(f: IO[bytes], size: int) -> dict[str, torch.Tensor]:
    """The ``size``-byte safetensors payload, each tensor read straight into its own memory."""
    import torch

    (head_len,) = _LEN.unpack(_read_exact(f, _LEN.size))
    if head_len > size - _LEN.size:
        raise ValueError(f"payload header of {head_len} bytes in a payload of {size}")
    try:
        meta = json.loads(_read_exact(f, head_len))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"payload header is not JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise ValueError("payload header is not an object")
    meta.pop("__metadata__", None)
    data = size - _LEN.size - head_len
    entries = []
    for name, m in meta.items():
        try:
            dtype = getattr(torch, _DTYPES[m["dtype"]])
            shape = [int(d) for d in m["shape"]]
            begin, end = (int(o) for o in m["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"payload entry {name!r} is not a safetensors tensor: {m!r}") from None
        numel = math.prod(shape)
        if min(shape, default=0) < 0 or not 0 <= begin <= end <= data or end - begin != numel * dtype.itemsize:
            raise ValueError(f"payload entry {name!r}: offsets {begin}..{end} do not hold {shape} {m['dtype']}")
        entries.append((begin, end, name, dtype, shape))
    entries.sort(key=lambda e: e[:2])
    out: dict[str, torch.Tensor] = {}
    at = 0
    for begin, end, name, dtype, shape in entries:
        if begin < at:
            raise ValueError(f"payload entry {name!r} overlaps the one before it")
        if begin > at:
            _read_exact(f, begin - at)  # a gap (not written by write_frame): skipped
        t = torch.empty(shape, dtype=dtype)
        _read_into(f, _bytes_of(t))
        out[name] = t
        at = end
    if at < data:
        _read_exact(f, data - at)
    return {name: out[name] for name in meta}
