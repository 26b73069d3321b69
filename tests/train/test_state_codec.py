"""The rank-state codec: each storage once, views rebuilt, a restored rank fingerprints equal."""

import pickle

import pytest
import torch

from ftkit.train.rank.state import fingerprint_state
from ftkit.train.rank.state_codec import CODEC, RankState, capture, decode, encode, restore, state_bytes


class Tiny(torch.nn.Module):
    def __init__(self, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = torch.nn.Parameter(torch.randn(4, 3, generator=g))
        self.b = torch.nn.Parameter(torch.randn(3, generator=g))


def trained(seed=0, steps=2):
    model = Tiny(seed)
    named = list(model.named_parameters())
    opt = torch.optim.AdamW([p for _, p in named], lr=0.1, weight_decay=0.0, foreach=False)
    for _ in range(steps):
        opt.zero_grad()
        (model.w.sum() * model.b.square().sum()).backward()
        opt.step()
    return model, named, opt


def test_a_restored_rank_holds_the_donors_state_bitwise():
    model, named, opt = trained()
    witness = torch.arange(8, dtype=torch.float32).reshape(4, 2)
    torch.manual_seed(1234)
    tensors, meta = encode(capture(named, opt, witness, {"step": 5, "rollout": 2}))
    tensors, meta = pickle.loads(pickle.dumps((tensors, meta)))  # what crosses a process boundary
    fresh, fresh_named, fresh_opt = trained(seed=9, steps=0)
    fresh_witness = torch.zeros(4, 2)
    torch.manual_seed(0)
    state = decode(tensors, meta)
    restore(state, fresh_named, fresh_opt, fresh_witness)
    assert fingerprint_state(fresh, fresh_opt)[0] == fingerprint_state(model, opt)[0]
    assert torch.equal(fresh_witness, witness)
    assert state.counters == {"step": 5, "rollout": 2}
    assert torch.equal(torch.rand(3), (torch.manual_seed(1234), torch.rand(3))[1])  # RNG state too
    assert sorted(fresh_opt.state[fresh.w]) == ["exp_avg", "exp_avg_sq", "step"]


def test_tensors_sharing_a_storage_are_sent_once_and_share_again():
    base = torch.arange(12, dtype=torch.float32)
    state = RankState(
        params={"a": base[:6].view(2, 3), "b": base[6:].view(3, 2), "t": base.view(4, 3).t()},
        optimizer={},
        witness=None,
        rng=torch.zeros(4, dtype=torch.uint8),
    )
    tensors, meta = encode(state)
    assert meta["codec"] == CODEC
    assert len(tensors) == 2 and state_bytes(tensors) == 12 * 4 + 4  # one float storage, one rng
    got = decode(*pickle.loads(pickle.dumps((tensors, meta))))
    for name, t in state.params.items():
        assert torch.equal(got.params[name], t) and got.params[name].stride() == t.stride()
    got.params["a"][0, 0] = 100.0  # views of one received storage again
    assert got.params["t"][0, 0] == 100.0


def test_decode_refuses_other_payloads_and_restore_other_models():
    model, named, opt = trained()
    tensors, meta = encode(capture(named, opt, None, {}))
    with pytest.raises(ValueError, match="not a rank state"):
        decode(tensors, {**meta, "codec": "something/1"})
    state = decode(tensors, meta)
    del state.params["b"]
    with pytest.raises(ValueError, match="does not match"):
        restore(state, named, opt, None)


def test_an_owned_state_becomes_the_optimizer_state_without_a_copy():
    model, named, opt = trained()
    tensors, meta = encode(capture(named, opt, None, {}))
    tensors = {k: v.clone() for k, v in tensors.items()}  # buffers of the recipient's own
    for owned in (False, True):
        fresh, fresh_named, fresh_opt = trained(seed=9, steps=0)
        state = decode(tensors, meta)
        restore(state, fresh_named, fresh_opt, None, owned=owned)
        assert fingerprint_state(fresh, fresh_opt)[0] == fingerprint_state(model, opt)[0]
        held = fresh_opt.state[fresh.w]["exp_avg"].untyped_storage().data_ptr()
        sent = state.optimizer["w.exp_avg"].untyped_storage().data_ptr()
        assert (held == sent) is owned
