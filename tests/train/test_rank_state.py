"""State fingerprints of a rank: every parameter and every optimizer tensor, one total."""

import torch

from ftkit.tensors.fingerprint import combine, fingerprint
from ftkit.train.rank.state import fingerprint_state


def _stepped():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    return model, opt


def test_every_parameter_and_optimizer_tensor_is_fingerprinted():
    model, opt = _stepped()
    total, params, optim = fingerprint_state(model, opt)
    named = dict(model.named_parameters())
    assert params == {n: fingerprint(p) for n, p in named.items()}
    assert sorted(optim) == sorted(f"{n}.{k}" for n in named for k in ("exp_avg", "exp_avg_sq", "step"))
    assert optim["0.weight.exp_avg"] == fingerprint(opt.state[named["0.weight"]]["exp_avg"])
    assert total == combine(
        {**{f"param/{n}": h for n, h in params.items()}, **{f"optimizer/{n}": h for n, h in optim.items()}}
    )
    # the caller's kept (name, parameter) list gives the same result as walking the model
    assert fingerprint_state(model, opt, list(model.named_parameters())) == (total, params, optim)


def test_a_changed_optimizer_tensor_changes_its_entry_and_the_total():
    model, opt = _stepped()
    total, params, optim = fingerprint_state(model, opt)
    opt.state[model[1].bias]["exp_avg_sq"][0] += 1.0
    total2, params2, optim2 = fingerprint_state(model, opt)
    assert params2 == params and total2 != total
    assert [n for n in optim if optim[n] != optim2[n]] == ["1.bias.exp_avg_sq"]
