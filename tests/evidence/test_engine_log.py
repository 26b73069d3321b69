"""Weight syncs through the evidence API: every engine proves what it holds (FT102), covered only
when promised."""

from __future__ import annotations

import pytest

from ftkit.analysis.engine import analyze_paths
from ftkit.evidence import EngineLog, EvidenceProfile, EvidenceRun

torch = pytest.importorskip("torch")


def _run(tmp_path, stale: bool):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = EvidenceRun(tmp_path, EvidenceProfile(weights=True), engines=2)
    engines = [EngineLog(tmp_path, e) for e in range(2)]
    run.allocate(0, range(4))
    for step in range(2):
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
        run.step(step, model=model, optimizer=opt, samples=[2 * step, 2 * step + 1], metrics={"loss": 0.5})
        sent = run.weights_sent(0, step, model)
        held = {n: p.detach().clone() for n, p in model.named_parameters()}
        if stale and step == 1:
            held["weight"] = held["weight"].to(torch.bfloat16).to(torch.float32)  # a lossy transfer
        for e in engines:
            assert (e.loaded(0, step, held) == sent) is not (stale and step == 1)
    for e in engines:
        e.close()
    run.close()
    return analyze_paths([tmp_path / "events"])


def test_engines_that_hold_what_was_sent_pass_and_ft102_is_covered(tmp_path):
    result = _run(tmp_path, stale=False)
    assert result.verdict() == "pass", result.findings
    assert result.stats["not_covered"] == ["FT110"] and result.stats["engines"] == 2
    assert next(r for r in result.rules if r.code == "FT102").checked == 4


def test_an_engine_holding_other_weights_is_ft102(tmp_path):
    result = _run(tmp_path, stale=True)
    found = [f for f in result.findings if f.code == "FT102"]
    assert found and found[0].evidence["version"] == 1 and found[0].evidence["tensors"] == ["weight"]
