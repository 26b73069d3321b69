"""What ``--resume`` builds on: the state payload (its state fingerprint is a TP=1/PP=1 rank's
logged total), the newest checkpoint that verifies (older ones as fallback, with a warning),
and loading it back bitwise."""

from __future__ import annotations

import pytest
import torch

from ftkit.checkpoint.guard import GuardVerdict
from ftkit.checkpoint.layout import EXTRA, MODEL, OPTIMIZER
from ftkit.checkpoint.preflight import agree, preflight
from ftkit.checkpoint.publish import Publisher
from ftkit.checkpoint.restore import load, state_payload
from ftkit.checkpoint.retention import RetentionPolicy
from ftkit.checkpoint.selection import newest_trusted
from ftkit.errors import InputError
from ftkit.train.rank.state import fingerprint_state


def _model_and_optimizer(seed: int):  # noqa: ANN202
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(5, 8)).sum().backward()
    opt.step()
    return model, opt


def _publish(pub: Publisher, step: int, seed: int) -> tuple[str, dict]:
    model, opt = _model_and_optimizer(seed)
    total, _, _ = fingerprint_state(model, opt)
    params = {n: p.detach() for n, p in model.named_parameters()}
    optim = {f"{n}.{k}": v for n, p in model.named_parameters() for k, v in sorted(opt.state[p].items())}
    extra = {"rng": torch.default_generator.get_state(), "counters": torch.tensor([step, step // 4])}
    p = state_payload(params, optim, extra, {"layout": {"tp": 1, "pp": 1}}, {"0": total})
    gv = GuardVerdict(max(0, step - 3), step, False)
    out = pub.publish(step, p, gv, agree([preflight(pub.dir, step, p.nbytes, gv, "r0")]), metric=0.5)
    assert out.published, out.reason
    return total, {"params": params, "optim": optim, "extra": extra}


def test_state_fingerprint_is_the_ranks_total_and_load_is_bitwise(tmp_path) -> None:
    from ftkit.checkpoint.manifest import load as load_manifest

    pub = Publisher(tmp_path / "checkpoints", RetentionPolicy())
    total, state = _publish(pub, 3, seed=1)
    man, _ = load_manifest(pub.dir / "step_000003" / "MANIFEST.json")
    assert man.state_fingerprint == total == man.rank_totals["0"]
    files, meta = load(pub.dir / "step_000003")
    assert meta["step"] == 3 and meta["layout"] == {"tp": 1, "pp": 1}
    for name, t in state["params"].items():
        assert torch.equal(files[MODEL][name], t)
    for name, t in state["optim"].items():
        assert files[OPTIMIZER][name].dtype == t.dtype and torch.equal(files[OPTIMIZER][name], t)
    assert torch.equal(files[EXTRA]["rng"], state["extra"]["rng"])


def test_newest_trusted_falls_back_with_a_warning(tmp_path) -> None:
    pub = Publisher(tmp_path / "checkpoints", RetentionPolicy(keep_last=3))
    for i, step in enumerate((3, 7, 11)):
        _publish(pub, step, seed=i)
    warnings: list[str] = []
    assert newest_trusted(pub.dir, warnings.append, events=False) == pub.dir / "step_000011" and warnings == []
    target = pub.dir / "step_000011" / OPTIMIZER
    data = bytearray(target.read_bytes())
    data[-1] ^= 0x40
    target.write_bytes(bytes(data))
    assert newest_trusted(pub.dir, warnings.append, events=False) == pub.dir / "step_000007"
    assert len(warnings) == 1 and "step_000011 does not verify (FT204" in warnings[0]
    with pytest.raises(InputError, match="does not verify"):
        load(pub.dir / "step_000011")


def test_newest_trusted_reconciles_first_and_handles_nothing(tmp_path) -> None:
    pub = Publisher(tmp_path / "checkpoints", RetentionPolicy())
    assert newest_trusted(pub.dir, events=False) is None  # no directory at all
    _publish(pub, 3, seed=0)
    (pub.dir / "step_000007").mkdir()  # renamed but never committed
    warnings: list[str] = []
    assert newest_trusted(pub.dir, warnings.append, events=False) == pub.dir / "step_000003"
    assert warnings == [f"{pub.dir}: removed step_000007, which was never published"]
