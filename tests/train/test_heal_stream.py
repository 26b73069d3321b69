"""The heal stream (``ftkit.train.rank.heal_stream``): real sockets, a real TCPStore rendezvous."""

import datetime
import socket
import threading
import time

import pytest
import torch
import torch.distributed as dist

from ftkit.train.rank import heal_stream
from ftkit.train.rank.state_codec import RankState, decode, encode, state_bytes


@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=5))


def _state() -> RankState:
    fused = torch.arange(64, dtype=torch.float32)
    return RankState(
        params={"a": fused[:16].view(4, 4), "b": fused[16:], "c": torch.randn(3, 5)},
        optimizer={"c.exp_avg": torch.zeros(3, 5), "c.step": torch.tensor(3.0)},
        witness=torch.ones(2, 2, dtype=torch.float64),
        rng=torch.default_generator.get_state(),
        counters={"step": 4, "rollout": 2},
    )


def _serve(store, key, tensors, meta, out, timeout=5.0):
    try:
        out["sent"] = heal_stream.serve(store, key, tensors, meta, lambda: "ab" * 16, timeout)
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        out["error"] = exc


def test_a_state_streams_each_storage_once_into_fresh_buffers(store):
    state = _state()
    tensors, meta = encode(state)
    out: dict = {}
    donor = threading.Thread(target=_serve, args=(store, "heal/c1/i1/a0/r0", tensors, meta, out))
    donor.start()
    got, got_meta, total, seconds = heal_stream.receive(store, "heal/c1/i1/a0/r0", 5.0)
    donor.join()
    assert out == {"sent": state_bytes(tensors)} and total == "ab" * 16
    assert set(seconds) == {"wait", "fetch", "trailer"}
    assert got_meta == meta and sorted(got) == sorted(tensors)
    for name, t in got.items():  # received into buffers of its own, not the donor's memory
        assert t.data_ptr() != tensors[name].data_ptr() and torch.equal(t, tensors[name])
    back = decode(got, got_meta)
    for name, t in state.named().items():
        assert torch.equal(back.named()[name], t), name
    # the fused storage came once and its views share it again
    assert back.params["a"].untyped_storage().data_ptr() == back.params["b"].untyped_storage().data_ptr()
    assert back.counters == state.counters


def test_a_donor_that_dies_mid_stream_is_a_connection_error(store):
    host = torch.zeros(1 << 20, dtype=torch.uint8)

    def half_donor():
        with socket.create_server(("127.0.0.1", 0)) as server:
            store.set("k", f"127.0.0.1:{server.getsockname()[1]}")
            conn, _ = server.accept()
            with conn:
                heal_stream._send_json(conn, {"meta": {}, "storages": [["storage/0", host.numel()]]})
                conn.sendall(bytes(1000))  # then the process "dies": the socket closes

    t = threading.Thread(target=half_donor)
    t.start()
    with pytest.raises(ConnectionError, match="after 1000 of"):
        heal_stream.receive(store, "k", 5.0)
    t.join()


def test_a_recipient_that_never_connects_times_the_donor_out(store):
    tensors, meta = encode(_state())
    out: dict = {}
    _serve(store, "nobody", tensors, meta, out, timeout=0.3)
    assert isinstance(out["error"], TimeoutError)
    assert store.get("nobody")  # the donor did publish where it listened


def test_a_donor_called_off_by_the_driver_gives_up_at_once_not_at_its_timeout(store):
    """The driver learnt from Ray that the recipient died before connecting: it sets the
    transfer's cancel key and the donor, waiting in accept for 60 s, returns within a slice."""
    tensors, meta = encode(_state())
    out: dict = {}
    donor = threading.Thread(target=_serve, args=(store, "dead-recipient", tensors, meta, out, 60.0))
    donor.start()
    while not store.check(["dead-recipient"]):  # the donor listens
        time.sleep(0.01)
    store.set(heal_stream.cancel_key("dead-recipient"), "1")
    donor.join(timeout=10 * heal_stream.ACCEPT_SLICE_S)
    assert not donor.is_alive(), "the donor still waits for a recipient the driver knows is dead"
    assert isinstance(out["error"], ConnectionError) and "cancelled by the driver" in str(out["error"])


def test_a_storage_that_is_one_tensor_of_the_room_is_received_in_place(store):
    from ftkit.train.rank.heal import destinations

    state = _state()
    tensors, meta = encode(state)
    room = {"param/c": torch.empty(3, 5), "optimizer/c.exp_avg": torch.full((3, 5), 7.0), "param/a": torch.empty(4, 4)}
    out: dict = {}
    donor = threading.Thread(target=_serve, args=(store, "room", tensors, meta, out))
    donor.start()
    got, got_meta, _, _ = heal_stream.receive(store, "room", 5.0, destinations(room))
    donor.join()
    back = decode(got, got_meta)
    # received into the room's own memory
    assert back.params["c"].data_ptr() == room["param/c"].data_ptr()
    assert back.optimizer["c.exp_avg"].data_ptr() == room["optimizer/c.exp_avg"].data_ptr()
    assert torch.equal(room["param/c"], state.params["c"]) and torch.equal(
        room["optimizer/c.exp_avg"], torch.zeros(3, 5)
    )
    # "a" shares its storage with "b": a fresh buffer, the room's tensor untouched
    assert back.params["a"].data_ptr() != room["param/a"].data_ptr()
    assert torch.equal(back.params["a"], state.params["a"])
