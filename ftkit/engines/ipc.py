"""The wire format between an engine client and its engine server process (a pair of pipes).

A message is one frame: an 8-byte little-endian length and a UTF-8 JSON header, then an
8-byte little-endian length and a payload of safetensors bytes (length 0: no tensors). The
header is a JSON object; tensors travel only in the payload, so nothing on the wire is ever
unpickled. Both sides (ftkit's main environment and the engine's virtualenv) import only
this module, ``json``, ``struct`` and ``safetensors``.

Contract:

* ``write_frame(f, header, tensors)`` writes one frame and flushes; ``tensors`` may be empty.
* ``read_frame(f)`` returns ``(header, tensors)``; at a clean end of stream (the peer exited
  before a new frame) it raises ``EOFError``, and a frame cut short raises ``EOFError`` too
  (the peer died mid-write): a reader never returns a partial message.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

_LEN = struct.Struct("<Q")


def write_frame(f: IO[bytes], header: Mapping[str, Any], tensors: Mapping[str, torch.Tensor] | None = None) -> int:
    """Write one frame (header, then the tensors as safetensors bytes) and flush; returns the
    payload's size in bytes."""
    head = json.dumps(dict(header)).encode()
    payload = b""
    if tensors:
        from safetensors.torch import save

        payload = save({k: v.detach().contiguous() for k, v in tensors.items()})
    f.write(_LEN.pack(len(head)))
    f.write(head)
    f.write(_LEN.pack(len(payload)))
    if payload:
        f.write(payload)
    f.flush()
    return len(payload)


def _read_exact(f: IO[bytes], n: int) -> bytes:
    chunks, left = [], n
    while left:
        got = f.read(left)
        if not got:
            raise EOFError(f"stream ended {left} bytes before the end of a frame")
        chunks.append(got)
        left -= len(got)
    return b"".join(chunks)


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
    tensors: dict[str, torch.Tensor] = {}
    if size:
        from safetensors.torch import load

        tensors = load(_read_exact(f, size))
    return header, tensors
