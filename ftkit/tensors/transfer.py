"""Tensors through Ray's object store without pickling their bytes.

Ray pickles a torch tensor's storage into a byte string before it copies that into the object
store, and a reader unpickles a private copy again: two copies of every byte per hop on top of
the store's own. Numpy arrays go out of band instead: Ray writes their bytes into the store once
and a reader on any node gets read-only views of the store's memory. ``PackedTensors`` rides on
that for a state of CPU tensors (the weight sync of ``ftkit train``, docs/engines.md):

- ``PackedTensors.of(tensors)``: each tensor as a flat uint8 numpy view of its bytes (no copy for
  a contiguous CPU tensor: the packer must not change the tensors until Ray has stored them,
  which for an actor method's return value is before its next call) with its dtype name and
  shape; any dtype torch has, bfloat16 included (numpy never interprets the bytes);
- ``unpack()``: ``{name: tensor}`` of the same dtypes, shapes and bytes, viewing the arrays'
  memory (read-only when it is the object store's: copy out of them, never write into them).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

    import numpy as np
    import torch


@dataclass(frozen=True)
class PackedTensors:
    """``{name: (dtype name, shape, flat uint8 bytes)}`` (see the module docstring)."""

    entries: dict[str, tuple[str, tuple[int, ...], np.ndarray]]

    @classmethod
    def of(cls, tensors: Mapping[str, torch.Tensor]) -> PackedTensors:
        """Views of ``tensors``' bytes (a non-contiguous or non-CPU tensor is copied once)."""
        import torch

        from ftkit.tensors.fingerprint import dtype_name

        entries = {}
        for name, t in tensors.items():
            flat = t.detach().cpu().contiguous().reshape(-1)
            entries[name] = (dtype_name(t.dtype), tuple(t.shape), flat.view(torch.uint8).numpy())
        return cls(entries)

    def unpack(self) -> dict[str, torch.Tensor]:
        """The tensors, viewing the packed bytes (the module docstring)."""
        import torch

        out = {}
        with warnings.catch_warnings():  # the store's memory is read-only, and is only read here
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            for name, (dtype, shape, data) in self.entries.items():
                if not data.size:  # (an empty array's strides cannot be reinterpreted)
                    out[name] = torch.empty(shape, dtype=getattr(torch, dtype))
                    continue
                out[name] = torch.from_numpy(data).view(getattr(torch, dtype)).reshape(shape)
        return out
