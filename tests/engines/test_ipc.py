"""ipc frames: headers and safetensors payloads round-trip; a cut stream is EOFError, never a
partial reply; the streamed payload is a safetensors file, and a safetensors file is a payload."""

import io
import json
import struct

import pytest
import torch

from ftkit.engines.ipc import read_frame, write_frame


def test_frames_round_trip_in_order() -> None:
    buf = io.BytesIO()
    t = {"w": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), "i": torch.tensor([1, 2], dtype=torch.int64)}
    write_frame(buf, {"op": "load", "version": 3}, t)
    write_frame(buf, {"op": "held"})
    buf.seek(0)
    h1, p1 = read_frame(buf)
    h2, p2 = read_frame(buf)
    assert h1 == {"op": "load", "version": 3} and h2 == {"op": "held"} and p2 == {}
    assert all(torch.equal(p1[k], t[k]) and p1[k].dtype == t[k].dtype for k in t)
    with pytest.raises(EOFError, match="stream ended"):
        read_frame(buf)


@pytest.mark.parametrize("cut", [3, 10, 30, 60, 100])
def test_a_frame_cut_short_is_eof(cut: int) -> None:
    buf = io.BytesIO()
    write_frame(buf, {"op": "x"}, {"w": torch.zeros(4)})
    with pytest.raises(EOFError):
        read_frame(io.BytesIO(buf.getvalue()[:cut]))


TENSORS = {
    "w": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3),
    "i": torch.tensor([1, 2], dtype=torch.int64),
    "scalar": torch.tensor(3.5),
    "empty": torch.zeros(0, 4),
    "mask": torch.tensor([True, False]),
    "view": torch.arange(12.0).reshape(3, 4).t(),  # not contiguous: sent as its values
}


def _frame(payload: bytes) -> io.BytesIO:
    head = json.dumps({"op": "load"}).encode()
    return io.BytesIO(struct.pack("<Q", len(head)) + head + struct.pack("<Q", len(payload)) + payload)


def _same(got: dict, want: dict) -> bool:
    return sorted(got) == sorted(want) and all(
        got[k].dtype == want[k].dtype and got[k].shape == want[k].shape and torch.equal(got[k], want[k]) for k in want
    )


def test_the_streamed_payload_is_a_safetensors_file_and_back() -> None:
    from safetensors.torch import load, save

    buf = io.BytesIO()
    size = write_frame(buf, {"op": "load"}, TENSORS)
    raw = buf.getvalue()
    payload = raw[8 + int.from_bytes(raw[:8], "little") + 8 :]
    assert len(payload) == size
    assert _same(load(payload), {k: v.contiguous() for k, v in TENSORS.items()})  # safetensors reads it
    _, got = read_frame(io.BytesIO(raw))
    assert list(got) == list(TENSORS) and _same(got, TENSORS)  # in the writer's order
    _, got = read_frame(_frame(save({k: v.contiguous() for k, v in TENSORS.items()})))  # and it reads safetensors
    assert _same(got, TENSORS)


def _payload(meta: dict, data: bytes) -> bytes:
    head = json.dumps(meta).encode()
    return struct.pack("<Q", len(head)) + head + data


@pytest.mark.parametrize(
    "meta, data, message",
    [
        (
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
            },
            bytes(8),
            "overlaps",
        ),
        ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, bytes(8), "do not hold"),
        ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8), "do not hold"),
        ({"a": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}, bytes(8), "not a safetensors tensor"),
        ({"a": [1, 2]}, bytes(8), "not a safetensors tensor"),
    ],
)
def test_a_payload_that_is_not_safetensors_is_a_value_error(meta: dict, data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_frame(_frame(_payload(meta, data)))


def test_a_payload_header_longer_than_the_payload_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="payload header"):
        read_frame(_frame(struct.pack("<Q", 1 << 40) + b"{}"))
