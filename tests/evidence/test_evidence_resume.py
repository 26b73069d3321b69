"""EvidenceRun(..., resume=True) in one process: a session that died (its logs left unclosed) is
resumed from the newest trusted checkpoint that ends its rollout, the state restored, the run
analyzed as one run (every sample exactly once) and its checkpoints verified. The torchrun case
with a real SIGKILL is tests/evidence/test_torchrun.py."""

from __future__ import annotations

import json

import pytest

from ftkit import cli
from ftkit.evidence import EvidenceProfile, EvidenceRun

torch = pytest.importorskip("torch")
PROFILE = EvidenceProfile(checkpoint_every=2)
STEPS_PER_ROLLOUT = 4  # checkpoints at steps 1 (mid-rollout), 3 (its end), 5, 7


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def _train(run: EvidenceRun, model, opt, start, until: int) -> None:
    """Train from ``start`` (a ResumePoint) to step ``until`` (excluded); sample id = step."""
    step = start.step
    for rollout in range(start.rollout, 2):
        ids = range(rollout * STEPS_PER_ROLLOUT, (rollout + 1) * STEPS_PER_ROLLOUT)
        run.allocate(rollout, ids)
        for step in ids:
            if step >= until:
                return
            opt.zero_grad()
            model(torch.full((1, 4), float(step))).pow(2).sum().backward()
            assert run.observe_grads(step, model, rollout=rollout)
            opt.step()
            run.step(step, model=model, optimizer=opt, samples=[step], metrics={"loss": 0.0}, rollout=rollout)
            if PROFILE.due("checkpoint", step):
                run.publish_checkpoint(step, model, opt, rollout=rollout, keep_last=4)


def _params(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_a_dead_session_is_resumed_from_the_checkpoint_that_ends_its_rollout(tmp_path, capsys):
    model, opt = _model()
    first = EvidenceRun(tmp_path, PROFILE, resume=True)  # a new directory: starts as new
    assert first.restore(model, opt).step == 0 and not first.start.resumed
    _train(first, model, opt, first.start, until=7)  # dies after step 6: nothing closed
    metas = {p.name: json.loads((p / "meta.json").read_text()) for p in (tmp_path / "checkpoints").glob("step_*")}
    assert {n: m["rollout_complete"] for n, m in metas.items()} == {
        "step_000001": False,
        "step_000003": True,
        "step_000005": False,
    }

    model, opt = _model()  # a new process: the seed's state
    again = EvidenceRun(tmp_path, PROFILE, resume=True)
    start = again.restore(model, opt)
    assert (start.step, start.rollout, start.checkpoint, start.checkpoint_rollout) == (4, 1, "step_000003", 0)
    assert len(start.skipped) == 1 and "step_000005" in start.skipped[0] and "rollout 1" in start.skipped[0]
    stored = _params(tmp_path / "checkpoints" / "step_000003")
    assert all(torch.equal(p, stored[n]) for n, p in model.named_parameters())
    assert opt.state[next(model.parameters())]["step"].item() == 4  # the optimizer state is restored too
    _train(again, model, opt, start, until=8)
    again.close()

    driver = [json.loads(x) for x in (tmp_path / "events" / "driver-i1.jsonl").read_text().splitlines()]
    assert driver[0]["type"] == "run_resumed" and driver[0]["checkpoint_step"] == 3
    assert "evidence_profile" not in {e["type"] for e in driver}
    code = cli.main(["analyze-events", str(tmp_path / "events"), "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["verdict"] == "pass", doc["findings"]
    # step 4 was committed (closed) by the dead session and trained again (5-6 never closed there):
    # the report shows the restart
    assert doc["stats"]["restarts"] == [{"checkpoint_step": 3, "retrained": 1}]
    assert doc["stats"]["steps_committed"] == 5 + 4
    assert cli.main(["analyze-events", str(tmp_path / "events")]) == 0
    human = " ".join(capsys.readouterr().out.split())
    assert "9 committed steps of 9 attempts (1 trained again after a restart)" in human, human
    assert "1 restart (resumed from step 3)" in human, human
    assert cli.main(["verify-checkpoint", str(tmp_path)]) == 0
    capsys.readouterr()


def test_without_resume_an_earlier_session_is_an_error_and_so_is_another_profile(tmp_path):
    EvidenceRun(tmp_path, PROFILE).close()
    with pytest.raises(ValueError, match="resume=True"):
        EvidenceRun(tmp_path, PROFILE)
    with pytest.raises(ValueError, match="evidence profile"):
        EvidenceRun(tmp_path, EvidenceProfile(), resume=True)


def test_a_session_of_another_fingerprint_scheme_is_refused(tmp_path):
    """A run directory begun before ftkit-fp2 (run.json without ``fingerprint_scheme``): this
    version's fingerprints could not be checked against its earlier session's."""
    EvidenceRun(tmp_path, PROFILE).close()
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["fingerprint_scheme"] == "ftkit-fp2"
    del doc["fingerprint_scheme"]
    (tmp_path / "run.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="fingerprints its state as ftkit-fp1, this ftkit as ftkit-fp2"):
        EvidenceRun(tmp_path, PROFILE, resume=True)
