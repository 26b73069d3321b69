"""Stable seeds for the random streams of a run.

Every random stream of ``ftkit train`` (the prompts of a rollout, the sampling of one
response) is seeded from a tuple of its coordinates, such as ``("sample", seed, rollout,
index)``, hashed with blake2b. The seed therefore never depends on the process, the cell,
the engine that draws it or Python's per-process ``hash()`` randomisation, so the same run
seed gives the same streams whatever the layout of the run.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

_PERSON = b"ftkit-seed"


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from ``parts`` (ints and strings), stable across processes and hosts.

    Different tuples give independent seeds: ``derive_seed("a", 1, 2) != derive_seed("a", 12)``
    because every part is length-prefixed before hashing.
    """
    h = hashlib.blake2b(digest_size=8, person=_PERSON)
    for part in parts:
        if isinstance(part, bool) or not isinstance(part, (int, str)):
            raise TypeError(f"seed parts must be int or str, not {type(part).__name__}")
        raw = part.encode() if isinstance(part, str) else part.to_bytes(16, "little", signed=True)
        h.update(b"s" if isinstance(part, str) else b"i")
        h.update(struct.pack("<I", len(raw)))
        h.update(raw)
    return int.from_bytes(h.digest(), "little") & ((1 << 63) - 1)


def torch_generator(*parts: int | str) -> Any:
    """A CPU ``torch.Generator`` seeded with ``derive_seed(*parts)``."""
    import torch

    g = torch.Generator(device="cpu")
    g.manual_seed(derive_seed(*parts))
    return g
