"""The heal transfer: one direct TCP stream from a donor rank to a recipient rank.

The donor's state (``state_codec.encode``: each storage once, views described in ``meta``)
goes straight from the donor's tensors into buffers the recipient allocated for it: no
pickling, no object store, no intermediate copy on either side (a CUDA storage is copied to
the host once on the donor). The two ranks meet through the driver's TCPStore: the driver
gives both the same ``key`` (one per recipient rank and heal attempt); the donor listens on
an ephemeral port of its node and publishes ``host:port`` under ``key``; the recipient waits
for it and connects.

Wire format (all integers big-endian)::

    donor -> recipient:  u64 n, n bytes of JSON header {"meta", "storages": [[name, nbytes]...]}
                         the storages' bytes, in header order
                         u64 n, n bytes of JSON trailer {"total": donor fingerprint total}
    recipient -> donor:  one byte b"\\x01" once everything arrived

The donor fingerprints its state *after* streaming it (the trailer), so its hashing overlaps
the recipient's loading. ``serve`` returns once the recipient acknowledged; ``receive``
returns the received ``(tensors, meta, donor_total)`` and per-phase seconds (``wait``: the
rendezvous until the header arrived, ``fetch``: the storages' bytes, ``trailer``: the donor's
total). Every wait (the rendezvous, each socket operation) is bounded by ``timeout_s`` (the
collective timeout): both sides are started together by the driver, so a peer that does not
show up within it is gone; a peer that dies or stalls mid-stream raises ``OSError``
(``socket.timeout`` / ``ConnectionError``) on the other side. A recipient that dies before it
connects would hold the donor in ``accept`` for the whole timeout: the driver, told by Ray that
the recipient died, sets ``cancel_key(key)`` and the donor, which checks it every
``ACCEPT_SLICE_S``, gives up at once (``ConnectionError``).
"""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor
    from torch.distributed import Store

_LEN = struct.Struct(">Q")
#: Bytes per ``recv_into`` / ``send`` call (large enough that the per-call cost vanishes).
CHUNK = 8 << 20
#: Seconds between two looks for the donor's address in the store.
POLL_S = 0.005
#: ``into(meta, storage name, nbytes) -> tensor or None``: where ``receive`` puts a storage.
Into = Callable[[dict[str, str], str, int], Any]


def node_address() -> str:
    """This process's node address, as other nodes reach it (Ray's view; loopback without Ray)."""
    try:
        import ray

        return str(ray.util.get_node_ip_address())
    except Exception:  # noqa: BLE001 - outside a Ray worker any failure means "this host"
        return "127.0.0.1"


#: Seconds between the donor's checks for a cancelled heal while it waits for the recipient.
ACCEPT_SLICE_S = 0.2


def cancel_key(key: str) -> str:
    """The store key the driver sets to call off the heal transfer under ``key``."""
    return f"{key}/cancel"


def _accept(server: socket.socket, store: Store, key: str, timeout_s: float) -> socket.socket:
    """The recipient's connection, within ``timeout_s``; ``ConnectionError`` when the driver
    cancelled the transfer first, ``socket.timeout`` when nobody came."""
    deadline = time.monotonic() + timeout_s
    while True:
        server.settimeout(max(0.001, min(ACCEPT_SLICE_S, deadline - time.monotonic())))
        try:
            conn, _ = server.accept()
            return conn
        except TimeoutError:
            if store.check([cancel_key(key)]):
                raise ConnectionError(f"heal {key}: cancelled by the driver (the recipient died)") from None
            if time.monotonic() >= deadline:
                raise


def serve(
    store: Store,
    key: str,
    tensors: dict[str, Tensor],
    meta: dict[str, str],
    total: Callable[[], str],
    timeout_s: float,
) -> int:
    """Stream ``tensors`` / ``meta`` (an ``encode`` result) to the recipient that connects
    through ``key``; ``total()`` (the donor's fingerprint total) is called after the bytes
    went out. Returns the bytes of storage sent."""
    with socket.create_server(("", 0)) as server:
        store.set(key, f"{node_address()}:{server.getsockname()[1]}")
        conn = _accept(server, store, key, timeout_s)
    with conn:
        conn.settimeout(timeout_s)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        names = sorted(tensors, key=_storage_index)
        host = {n: _host_bytes(tensors[n]) for n in names}
        header = {"meta": meta, "storages": [[n, int(host[n].numel())] for n in names]}
        _send_json(conn, header)
        sent = 0
        for n in names:
            view = _buffer(host[n])
            for i in range(0, len(view), CHUNK):
                conn.sendall(view[i : i + CHUNK])
            sent += len(view)
        _send_json(conn, {"total": total()})
        if _recv_exact(conn, 1) != b"\x01":
            raise ConnectionError(f"heal {key}: the recipient did not acknowledge")
    return sent


def receive(
    store: Store, key: str, timeout_s: float, into: Into | None = None
) -> tuple[dict[str, Any], dict[str, str], str, dict[str, float]]:
    """Connect to the donor serving ``key`` and receive its state:
    ``(tensors, meta, donor_total, seconds)`` (see the module docstring). Each storage goes
    into ``into(meta, name, nbytes)`` when that returns a tensor (a contiguous host uint8
    tensor of ``nbytes``: memory the caller already holds, no page faults while receiving),
    else into a freshly allocated buffer."""
    import torch

    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    while not store.check([key]):  # polled: a blocking store wait would hold the GIL
        if time.perf_counter() - t0 > timeout_s:
            raise TimeoutError(f"heal {key}: no donor listened within {timeout_s:g}s")
        time.sleep(POLL_S)
    host, port = store.get(key).decode().rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout_s) as conn:
        header = _recv_json(conn)
        t1 = time.perf_counter()
        seconds["wait"] = t1 - t0
        tensors: dict[str, Any] = {}
        for name, nbytes in header["storages"]:
            buf = into(header["meta"], name, int(nbytes)) if into is not None else None
            if buf is None:
                buf = torch.empty(int(nbytes), dtype=torch.uint8)
            view = _buffer(buf)
            got = 0
            while got < len(view):
                n = conn.recv_into(view[got : got + CHUNK])
                if not n:
                    raise ConnectionError(f"heal {key}: the donor closed the stream after {got} of {nbytes} bytes")
                got += n
            tensors[name] = buf
        t2 = time.perf_counter()
        seconds["fetch"] = t2 - t1
        trailer = _recv_json(conn)
        conn.sendall(b"\x01")
        seconds["trailer"] = time.perf_counter() - t2
    return tensors, header["meta"], str(trailer["total"]), seconds


def _storage_index(name: str) -> int:
    return int(name.rsplit("/", 1)[-1])


def _host_bytes(t: Tensor) -> Any:
    """A contiguous host uint8 tensor of ``t``'s bytes (``t`` itself when it already is one)."""
    return t if t.device.type == "cpu" and t.is_contiguous() else t.contiguous().cpu()


def _buffer(t: Tensor) -> memoryview:
    """A writable byte view of a contiguous host uint8 tensor (no copy)."""
    return t.numpy().data.cast("B")


def _send_json(conn: socket.socket, obj: object) -> None:
    data = json.dumps(obj).encode()
    conn.sendall(_LEN.pack(len(data)) + data)


def _recv_json(conn: socket.socket) -> Any:
    (n,) = _LEN.unpack(_recv_exact(conn, _LEN.size))
    return json.loads(_recv_exact(conn, n))


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"the peer closed the stream after {len(data)} of {n} bytes")
        data += chunk
    return bytes(data)
