"""The evidence API in one process (rank 0 of 1): import isolation, the run directory it writes,
fingerprints that match the checkpoint it publishes, the guard, per-step dumps that compare-dumps
reads, and ftkit's trainer sharing the same routines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ftkit import cli
from ftkit.evidence import EvidenceProfile, EvidenceRun

REPO = Path(__file__).resolve().parents[2]
torch = pytest.importorskip("torch")


def test_import_ftkit_and_the_evidence_api_import_neither_megatron_nor_ray():
    code = (
        "import sys, ftkit; top = [m for m in ('torch', 'megatron', 'ray', 'pydantic') if m in sys.modules]; "
        "import ftkit.evidence, ftkit.integrations; "
        "api = sorted({m.split('.')[0] for m in sys.modules} & {'megatron', 'ray', 'transformers'}); print(top, api)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] []"


def test_the_public_names_are_the_documented_ones():
    import ftkit

    assert sorted(ftkit.__all__) == [
        "EvidenceProfile",
        "EvidenceRun",
        "WitnessTable",
        "__version__",
        "fingerprint_state",
    ]
    assert all(getattr(ftkit, n) is not None for n in ftkit.__all__)
    assert (REPO / "ftkit" / "py.typed").is_file()


def test_ftkit_train_uses_the_same_routines():
    from ftkit.evidence.fingerprint import fingerprint_state
    from ftkit.evidence.witness_table import WitnessTable
    from ftkit.train.rank import state as rank_state
    from ftkit.train.rank import witness

    assert rank_state.fingerprint_state is fingerprint_state and witness.WitnessTable is WitnessTable


def _train(run: EvidenceRun, steps: int, nan_at: int | None = None, dump_at: int | None = None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    run.allocate(0, range(steps))
    for step in range(steps):
        for attempt in range(2):
            opt.zero_grad()
            x = torch.full((1, 4), float(step))
            if dump_at == step:
                with run.dump(step, model, params=True):
                    loss = model(x).pow(2).sum()
                    loss.backward()
            else:
                loss = model(x).pow(2).sum()
                loss.backward()
            if nan_at == step and attempt == 0:
                next(model.parameters()).grad[0, 0] = float("nan")
            if run.observe_grads(step, model):
                break
            run.step_outcome(step, "discarded", attempt=attempt)
        opt.step()
        run.step(step, model=model, optimizer=opt, samples=[step], metrics={"loss": loss}, attempt=attempt)
        if run.profile.due("checkpoint", step):
            run.publish_checkpoint(step, model, opt)
    run.close()
    return model, opt


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(x) for p in sorted((run_dir / "events").iterdir()) for x in p.read_text().splitlines()]


def test_a_run_directory_analyzes_and_verifies_like_ftkit_trains(tmp_path, capsys):
    run = EvidenceRun(tmp_path, EvidenceProfile(checkpoint_every=2), config={"lr": 0.01})
    _train(run, 4)
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["schema"] == "ftkit.run/1" and doc["run"] == tmp_path.name and doc["config"] == {"lr": 0.01}
    assert cli.main(["analyze-events", str(tmp_path / "events")]) == 0
    assert cli.main(["verify-checkpoint", str(tmp_path)]) == 0  # with the event log cross-checked
    capsys.readouterr()
    events = _events(tmp_path)
    fps = {e["step"]: e["total"] for e in events if e["type"] == "state_fingerprint"}
    published = [e for e in events if e["type"] == "checkpoint_published"]
    assert [e["step"] for e in published] == [1, 3]
    manifest = json.loads((tmp_path / "checkpoints" / "step_000003" / "MANIFEST.json").read_text())
    assert manifest["state_fingerprint"] == fps[3]  # the checkpoint holds exactly the logged state


def test_a_nan_gradient_is_discarded_retried_and_taints_the_checkpoint(tmp_path, capsys):
    _train(EvidenceRun(tmp_path, EvidenceProfile(checkpoint_every=2)), 4, nan_at=2)
    events = _events(tmp_path)
    assert [e["step"] for e in events if e["type"] == "grad_nonfinite"] == [2]
    rejected = [e for e in events if e["type"] == "checkpoint_rejected"]
    assert [e["step"] for e in rejected] == [3] and "guard" in rejected[0]["reason"]
    assert not (tmp_path / "checkpoints" / "step_000003").exists()
    assert (tmp_path / "checkpoints" / "step_000001" / "MANIFEST.json").is_file()
    assert cli.main(["analyze-events", str(tmp_path / "events")]) == 0  # retried: nothing lost
    capsys.readouterr()


def test_per_step_dumps_compare_across_runs(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        _train(EvidenceRun(d, EvidenceProfile(dump_every=2)), 2, dump_at=1)
    written = [e for e in _events(a) if e["type"] == "dump_written"]
    assert [(e["step"], e["phase"]) for e in written] == [(1, "fwd_bwd")]
    index = json.loads(next((a / "dumps").rglob("*.index.json")).read_text())
    names = {t["name"] for t in index["tensors"]}
    assert {"0.output", "0.output_grad", "0.weight.param", "0.weight.grad"} <= names
    assert cli.main(["compare-dumps", str(a / "dumps"), str(b / "dumps"), "--exact"]) == 0
    assert cli.main(["analyze-events", str(a / "events")]) == 0
    capsys.readouterr()


def test_a_promised_dump_that_is_missing_fails(tmp_path, capsys):
    _train(EvidenceRun(tmp_path, EvidenceProfile(dump_every=2)), 2)
    assert cli.main(["analyze-events", str(tmp_path / "events"), "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [f["code"] for f in doc["findings"]] == ["FT112"] and "dump_written" in doc["findings"][0]["message"]


def test_a_nan_update_committed_through_the_api_fails_whatever_is_promised(tmp_path, capsys):
    """Issue 38 item 1: a loop that ignores ``observe_grads`` and steps anyway, metrics not
    promised: ``grad_nonfinite`` on committed steps and rejected checkpoints were a PASS."""
    torch.manual_seed(0)
    run = EvidenceRun(tmp_path, EvidenceProfile(metric_every=None, checkpoint_every=2))
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run.allocate(0, range(6))
    for step in range(6):
        opt.zero_grad()
        model(torch.full((1, 4), float(step))).pow(2).sum().backward()
        if step == 2:
            next(model.parameters()).grad[0, 0] = float("nan")
        run.observe_grads(step, model)  # ignored: the optimizer steps anyway
        opt.step()
        run.step(step, model=model, optimizer=opt, samples=[step])
        if run.profile.due("checkpoint", step):
            run.publish_checkpoint(step, model, opt)
    run.close()
    assert cli.main(["analyze-events", str(tmp_path / "events"), "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "fail" and "FT109" in doc["stats"]["not_covered"]
    ft106 = [f for f in doc["findings"] if f["code"] == "FT106"]
    assert [f["evidence"]["step"] for f in ft106] == [2, 3, 4, 5]  # the NaN is in the weights from step 2 on
    assert "non-finite gradients" in ft106[0]["message"] and ft106[0]["evidence"]["tensors"] == ["0.weight"]


def test_a_checkpoint_between_two_fingerprints_verifies(tmp_path, capsys):
    """Issue 38 item 16: fingerprints every 3 steps, checkpoints every 4: the checkpoint of step 3
    had no logged fingerprint and ``verify-checkpoint`` failed a healthy run (FT214);
    ``publish_checkpoint`` logs the fingerprint it publishes."""
    _train(EvidenceRun(tmp_path, EvidenceProfile(fingerprint_every=3, checkpoint_every=4)), 8)
    events = _events(tmp_path)
    assert sorted({e["step"] for e in events if e["type"] == "state_fingerprint"}) == [2, 3, 5, 7]
    assert cli.main(["verify-checkpoint", str(tmp_path)]) == 0
    assert cli.main(["analyze-events", str(tmp_path / "events")]) == 0
    capsys.readouterr()
