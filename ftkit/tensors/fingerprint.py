"""128-bit tensor fingerprints and order-independent state fingerprints.

``fingerprint(t)`` hashes a small header (the scheme tag, dtype name, shape) and the tensor's
bytes in logical row-major order. Two schemes (docs/fingerprints.md):

- ``ftkit-fp2`` (``SCHEME``, what event logs and checkpoint manifests get): XXH3-64 of each
  256 KiB chunk of the bytes, then xxh3-128 over the header and the chunk digests. The chunks
  are independent, so a GPU hashes a tensor where it is (``ftkit.tensors.device_fingerprint``)
  and the host hashes them with the C library (``ftkit.tensors.chunked``): same digest.
- ``ftkit-fp1``: xxh3-128 over the header and the bytes. Dump indexes keep it (``DUMP_SCHEME``
  in ``ftkit.dumps.layout``), and files that name no scheme (checkpoints of earlier versions)
  are read with it.

Either way (the contract):

- a tensor and its contiguous copy have the same fingerprint, whatever the strides;
- the same values on CPU and on CUDA have the same fingerprint;
- dtype and shape are part of the digest (``zeros(4, int32)`` differs from ``zeros(2, int64)``
  and from ``zeros(2, 2, int32)``); 0-d and empty tensors are covered;
- every flipped bit of the data changes it (up to hash collisions);
- it is a pure function of (scheme, dtype name, shape, little-endian bytes), so a file reader
  can compute it from raw safetensors bytes without torch (``fingerprint_hasher``).

``combine`` folds ``{name: fingerprint}`` into one state fingerprint that does not depend on
the dict's insertion order; ``fingerprints`` hashes many tensors at once (one batch per device)
and ``fingerprint_tensors`` also combines them. ``fingerprint_array`` hashes a numpy array (the
forensic commands read dumps without torch).
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from json.encoder import encode_basestring_ascii as _json_str
from typing import TYPE_CHECKING, Any, TypeVar

import xxhash

from ftkit.tensors.xxh3_torch import CHUNK_BYTES as _FP2_CHUNK  # torch-free at import

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import torch

    from ftkit.tensors.xxh3 import Hasher

CHUNK_BYTES = 64 << 20  # host staging size for non-contiguous pieces and device copies
SCHEME = "ftkit-fp2"  # what this version writes into event logs and checkpoint manifests
SCHEMES = ("ftkit-fp1", "ftkit-fp2")
_COMBINE_FORMAT = b"ftkit-state-fp1\n"
K = TypeVar("K", bound=Hashable)
_LE64 = struct.Struct("<Q")
_STR = frozenset({str})


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (the name used in digests and dump indexes)."""
    return str(dtype).rsplit(".", 1)[-1]


def check_scheme(scheme: object) -> str:
    """``scheme`` if this version can compute it; ``ValueError`` naming the known ones."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown fingerprint scheme {scheme!r}: this ftkit computes {', '.join(SCHEMES)}")
    return str(scheme)


def _header(dtype: str, shape: Sequence[int], scheme: str = SCHEME) -> bytes:
    tag = check_scheme(scheme).encode()
    return b"\0".join([tag, dtype.encode(), ",".join(str(int(d)) for d in shape).encode(), b""])


def fingerprint_hasher(dtype: str, shape: Sequence[int], scheme: str = SCHEME) -> Hasher:
    """A streaming hasher that has consumed the header of (dtype name, shape): feed it the
    tensor's logical bytes in order, in pieces of any size, and ``hexdigest()`` is the
    fingerprint. It releases the GIL while hashing (``ftkit.tensors.xxh3``), so threads hash in
    parallel."""
    from ftkit.tensors import xxh3
    from ftkit.tensors.chunked import ChunkedHasher

    header = _header(dtype, shape, scheme)
    return ChunkedHasher(header) if scheme == "ftkit-fp2" else xxh3.new(header)


def fingerprint_buffers(dtype: str, shape: Sequence[int], buffers: Iterable[object], scheme: str = SCHEME) -> str:
    """Fingerprint from a dtype name, a shape and the logical bytes given as buffers in order.

    ``buffers`` are objects supporting the buffer protocol (bytes, memoryview, numpy arrays);
    their concatenation must be the tensor's row-major little-endian bytes.
    """
    h = fingerprint_hasher(dtype, shape, scheme)
    for buf in buffers:
        h.update(buf)
    return h.hexdigest()


def fingerprint_array(a: np.ndarray, scheme: str = SCHEME) -> str:
    """The fingerprint of a numpy array (no torch): equals ``fingerprint`` of the torch tensor
    with the same dtype, shape and values. bfloat16 and float8 arrays are ``ml_dtypes``
    arrays; numpy's dtype names are the torch names used in the digest."""
    import numpy as np

    h = fingerprint_hasher(a.dtype.name, a.shape, scheme)
    if a.size:  # (ascontiguousarray would turn a 0-d array into a 1-d one: keep the shape above)
        h.update(np.ascontiguousarray(a).reshape(-1).view(np.uint8))
    return h.hexdigest()


def fingerprint(t: torch.Tensor, chunk_bytes: int = CHUNK_BYTES, scheme: str = SCHEME) -> str:
    """32 lowercase hex chars (128 bit) of ``t``'s dtype, shape and logical bytes.

    Works for every dense strided dtype whose elements are whole bytes (floats including
    bfloat16 and float8, ints, uints, bool, complex). Raises ``TypeError`` for sparse,
    quantized or sub-byte tensors. Does not modify ``t`` and does not synchronise more than
    needed to read it. Under ``ftkit-fp2`` a tensor on a GPU is hashed there; under
    ``ftkit-fp1`` it is streamed to the host in ``chunk_bytes`` pieces.
    """
    import torch

    t = t.detach()
    if t.device.type != "cpu" and scheme == "ftkit-fp2":
        return fingerprints({"": t}, scheme)[""]
    if (
        t.device.type == "cpu"
        and t.dtype in _numpy_dtypes(torch)
        and t.layout == torch.strided
        and t.is_contiguous()
        and not t.is_neg()
    ):
        # fast path (per-step state fingerprints hash ~100 small tensors): the bytes of a
        # contiguous CPU tensor straight from its numpy view, the header cached
        header = _cached_header(t.dtype, tuple(t.shape), scheme)
        if scheme == "ftkit-fp2":
            if t.numel() * t.element_size() <= _FP2_CHUNK:  # one chunk (most tensors): two C calls
                chunk = _LE64.pack(xxhash.xxh3_64_intdigest(t.numpy())) if t.numel() else b""  # type: ignore[arg-type]
                return xxhash.xxh3_128(header + chunk).hexdigest()
            from ftkit.tensors.chunked import hash_contiguous

            return hash_contiguous(header, t.reshape(-1).numpy())
        h = xxhash.xxh3_128(header)
        if t.numel():
            h.update(t.numpy())  # type: ignore[arg-type]  # numpy's stubs give ndarray __buffer__ only on 3.12+
        return h.hexdigest()
    return fingerprint_buffers(dtype_name(t.dtype), tuple(t.shape), logical_bytes(t, chunk_bytes), scheme)


def fingerprints(tensors: Mapping[K, torch.Tensor], scheme: str = SCHEME) -> dict[K, str]:
    """``{name: fingerprint(t)}``. Under ``ftkit-fp2`` the tensors on each non-CPU device are
    hashed there in one batch (``fingerprints_on_device``: one copy of the chunk digests to
    the host for all of them). ``fingerprints_through_device_path`` sends CPU tensors through
    that code too (what the tests use to hold the device path to the host's digests)."""
    return _fingerprints(tensors, scheme, on_device=False)


def _fingerprints(tensors: Mapping[K, torch.Tensor], scheme: str, on_device: bool) -> dict[K, str]:
    check_scheme(scheme)
    out: dict[K, str] = {}
    batches: dict[Any, list[K]] = {}
    for name, t in tensors.items():
        if scheme == "ftkit-fp2" and (on_device or t.device.type != "cpu"):
            batches.setdefault(t.device, []).append(name)
        else:
            out[name] = fingerprint(t, scheme=scheme)
    if batches:
        from ftkit.tensors.device_fingerprint import fingerprints_on_device

        for names in batches.values():
            items = [(_header(dtype_name(tensors[n].dtype), tuple(tensors[n].shape), scheme), _device_bytes(tensors[n]))
                     for n in names]  # fmt: skip
            out.update(zip(names, fingerprints_on_device(items)))
    return {name: out[name] for name in tensors}


def fingerprints_through_device_path(tensors: Mapping[K, torch.Tensor]) -> dict[K, str]:
    """``fingerprints`` with every tensor (CPU ones too) hashed by the device code path."""
    return _fingerprints(tensors, "ftkit-fp2", on_device=True)


def _device_bytes(t: torch.Tensor) -> torch.Tensor:
    """``t``'s logical bytes as a contiguous flat uint8 tensor on its device (a copy only when
    ``t`` is not contiguous or is a lazy conjugate / negative view)."""
    return _flat_bytes(_resolved(t).contiguous())


def _resolved(t: torch.Tensor) -> torch.Tensor:
    """``t`` detached, its lazy conjugate / negative bits applied; ``TypeError`` for a sparse or
    quantized tensor (no fingerprint)."""
    import torch

    if t.layout != torch.strided or t.is_quantized:
        raise TypeError(f"cannot fingerprint a {t.layout} / quantized tensor of dtype {t.dtype}")
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t


@functools.lru_cache(maxsize=1)
def _numpy_dtypes(torch: Any) -> frozenset[Any]:
    """Dtypes whose numpy view holds exactly the tensor's bytes (no bfloat16, float8, complex)."""
    return frozenset(
        [
            torch.float16,
            torch.float32,
            torch.float64,
            torch.int8,
            torch.int16,
            torch.int32,
            torch.int64,
            torch.uint8,
            torch.bool,
        ]
    )


@functools.lru_cache(maxsize=4096)
def _cached_header(dtype: torch.dtype, shape: tuple[int, ...], scheme: str) -> bytes:
    return _header(dtype_name(dtype), shape, scheme)


def combine(fingerprints: Mapping[str, str]) -> str:
    """Order-independent state fingerprint of ``{name: fingerprint}``.

    The digest covers the sorted ``(name, fingerprint)`` pairs, so two dicts with the same
    items in any insertion order give the same result, and renaming, adding or dropping an
    entry changes it. The hashed bytes are, per pair in name order, ``json.dumps(name)``, ``:``,
    ``str(fingerprint)`` and a newline, after ``_COMBINE_FORMAT``; they are built as one string
    and hashed in one call (the analyzer recomputes every logged total: this is its hot path).
    """
    names = sorted(fingerprints)
    quote = _json_str if _STR.issuperset(map(type, names)) else json.dumps  # json.dumps(a str) is _json_str
    h = xxhash.xxh3_128(_COMBINE_FORMAT)
    if names:  # "name:value" lines joined in C (map / zip / str.join): no Python code per pair
        values = map(str, map(fingerprints.__getitem__, names))
        h.update(("\n".join(map(":".join, zip(map(quote, names), values))) + "\n").encode())
    return h.hexdigest()


def state_total(params: Mapping[str, str], optimizer: Mapping[str, str]) -> str:
    """The ``total`` of a ``state_fingerprint`` line: ``combine`` of both per-tensor maps with
    ``param/`` and ``optimizer/`` name prefixes (a parameter and an optimizer tensor can never
    stand in for each other). The analyzer recomputes every logged total with this."""
    named = {f"param/{n}": h for n, h in params.items()}
    named.update({f"optimizer/{n}": h for n, h in optimizer.items()})
    return combine(named)


def fingerprint_tensors(tensors: Mapping[str, torch.Tensor], scheme: str = SCHEME) -> tuple[str, dict[str, str]]:
    """``(total, {name: fingerprint})`` for a dict of tensors; ``total = combine(per_name)``."""
    per_name = fingerprints(tensors, scheme)
    return combine(per_name), per_name


def logical_bytes(t: torch.Tensor, chunk_bytes: int = CHUNK_BYTES) -> Iterator[object]:
    """Yield ``t``'s bytes in logical row-major order as host buffers.

    A contiguous CPU tensor is yielded as one zero-copy view. A non-contiguous CPU tensor is
    copied piece by piece into one reused staging buffer (each piece at most ``chunk_bytes``
    unless a single element is larger). Any other device goes through ``_device_chunks``: pieces are copied into two
    alternating pinned host buffers, so a large tensor never needs a full host copy. Each
    yielded buffer is valid only until the next one is requested.
    """
    import torch

    t = _resolved(t)
    if t.numel() == 0:
        return
    if t.device.type == "cpu":
        if t.is_contiguous():
            yield _host_bytes(t)
            return
        staging = torch.empty(min(chunk_bytes, t.numel() * t.element_size()), dtype=torch.uint8)
        for piece in _pieces(t, chunk_bytes):
            n = piece.numel() * piece.element_size()
            if n > staging.numel():  # a single element larger than the chunk
                staging = torch.empty(n, dtype=torch.uint8)
            dst = staging[:n].view(piece.dtype).view(piece.shape)
            dst.copy_(piece)
            yield _host_bytes(dst)
        return
    yield from _device_chunks(t, chunk_bytes)


def _flat_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor as a flat uint8 view (no copy)."""
    import torch

    flat = t.reshape(-1)
    if flat.numel() <= 1:  # torch calls 1-element tensors contiguous whatever their stride
        flat = flat.as_strided((flat.numel(),), (1,))
    try:
        return flat.view(torch.uint8)
    except RuntimeError as exc:  # sub-byte or otherwise unviewable dtypes
        raise TypeError(f"cannot fingerprint dtype {t.dtype}: {exc}") from exc


def _host_bytes(t: torch.Tensor) -> object:
    return _flat_bytes(t).numpy()


def _pieces(t: torch.Tensor, max_bytes: int) -> Iterator[torch.Tensor]:
    """Sub-tensors of ``t`` that tile it in row-major order, each at most ``max_bytes``."""
    es = t.element_size()
    if t.dim() == 0 or t.numel() * es <= max_bytes:
        yield t
        return
    if t.is_contiguous():
        flat = t.reshape(-1)
        step = max(1, max_bytes // es)
        for i in range(0, flat.numel(), step):
            yield flat[i : i + step]
        return
    row_bytes = (t.numel() // t.shape[0]) * es
    if row_bytes <= max_bytes:
        rows = max(1, max_bytes // row_bytes)
        for i in range(0, t.shape[0], rows):
            yield t[i : i + rows]
    else:
        for i in range(t.shape[0]):
            yield from _pieces(t[i], max_bytes)


def _device_chunks(t: torch.Tensor, chunk_bytes: int) -> Iterator[object]:
    """Stream a non-CPU tensor to host through two alternating staging buffers.

    The copy of piece k+1 is issued (asynchronously where the device allows it) before piece k
    is handed to the hasher, so transfer and hashing overlap on CUDA.
    """
    import torch

    cuda = t.device.type == "cuda"
    pin = cuda and torch.cuda.is_available()
    size = min(chunk_bytes, t.numel() * t.element_size())
    size = max(size, t.element_size())
    staging = [torch.empty(size, dtype=torch.uint8, pin_memory=pin) for _ in range(2)]
    pending: tuple[torch.Tensor, torch.cuda.Event | None] | None = None
    for k, piece in enumerate(_pieces(t, chunk_bytes)):
        src = _flat_bytes(piece.contiguous())
        buf = staging[k % 2][: src.numel()]
        buf.copy_(src, non_blocking=pin)
        event: torch.cuda.Event | None = None
        if pin:
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # torch leaves Event() unannotated
            event.record()
        if pending is not None:
            yield _ready(*pending)
        pending = (buf, event)
    if pending is not None:
        yield _ready(*pending)


def _ready(buf: torch.Tensor, event: torch.cuda.Event | None) -> object:
    if event is not None:
        event.synchronize()
    return buf.numpy()
