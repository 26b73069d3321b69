"""ipc frames: headers and safetensors payloads round-trip; a cut stream is EOFError, never a partial reply."""

import io

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


@pytest.mark.parametrize("cut", [3, 10, 30])
def test_a_frame_cut_short_is_eof(cut: int) -> None:
    buf = io.BytesIO()
    write_frame(buf, {"op": "x"}, {"w": torch.zeros(4)})
    with pytest.raises(EOFError):
        read_frame(io.BytesIO(buf.getvalue()[:cut]))
