"""``fingerprint_held``: what both sides of an engine's weight check compute. -0.0 is folded into
+0.0 unless the engine keeps signed zeros; the folded copies are hashed in batches (on a GPU one
device batch each), and the batching never changes a fingerprint."""

from __future__ import annotations

import torch

from ftkit.engines import protocol
from ftkit.tensors.fingerprint import combine, fingerprint


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out = {f"w{i}": torch.randn(300 * (i + 1), generator=g) for i in range(5)}
    out["w2"][::7] = -0.0
    return out


def test_signed_zeros_are_folded_unless_kept():
    w = _weights()
    total, per = protocol.fingerprint_held(w, signed_zeros=False)
    assert per["w2"] == fingerprint(torch.where(w["w2"] == 0, torch.zeros_like(w["w2"]), w["w2"]))
    assert per["w2"] != fingerprint(w["w2"]) and total == combine(per)
    kept_total, kept = protocol.fingerprint_held(w, signed_zeros=True)
    assert kept["w2"] == fingerprint(w["w2"]) and kept["w0"] == per["w0"] and kept_total != total


def test_batches_of_folded_copies_give_the_same_fingerprints(monkeypatch):
    w = _weights()
    whole = protocol.fingerprint_held(w, signed_zeros=False)
    monkeypatch.setattr(protocol, "FOLD_BATCH_BYTES", 2000)  # a batch every tensor or two
    batched = protocol.fingerprint_held(w, signed_zeros=False)
    assert batched == whole and list(batched[1]) == list(w)  # the caller's order
