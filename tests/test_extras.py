"""The install without the training stack (ftkit/extras.py): the forensics run with torch,
megatron and Ray unimportable; ``ftkit train`` then ends with exit 2 and the ``pip install``
hint; pyproject keeps the stack in the ``train`` extra, which scripts/setup.sh installs."""

from __future__ import annotations

import shutil

import pytest
from blocked_cli import REPO, ftkit_without


def test_ftkit_train_without_the_train_extra_is_exit_2_with_the_install_hint(tmp_path):
    for blocked in ("megatron", "ray", "torch,megatron,ray"):
        done = ftkit_without(blocked, "train", "--out", str(tmp_path / "run"))
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert (
            lines[0].startswith("Error: ftkit train needs ftkit's 'train' extra") and blocked.split(",")[-1] in lines[0]
        )
        assert lines[-1] == "Hint: pip install 'ftkit[train]'" and "Traceback" not in done.stderr
        assert not (tmp_path / "run").exists()


def test_the_forensics_run_without_torch_megatron_or_ray(tmp_path):
    torch = pytest.importorskip("torch")
    from ftkit.evidence import EvidenceProfile, EvidenceRun

    run = EvidenceRun(tmp_path, EvidenceProfile(checkpoint_every=1, dump_every=1))
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run.allocate(0, [0])
    with run.dump(0, model):
        model(torch.ones(1, 2)).sum().backward()
    opt.step()
    run.step(0, model=model, optimizer=opt, samples=[0], metrics={"loss": 1.0})
    run.publish_checkpoint(0, model, opt)
    run.close()
    shutil.copytree(tmp_path / "dumps", tmp_path / "dumps-copy")  # compare-dumps refuses one tree twice
    none = "torch,megatron,ray"
    for args in (
        ["analyze-events", str(tmp_path / "events")],
        ["verify-checkpoint", str(tmp_path)],
        ["compare-dumps", str(tmp_path / "dumps"), str(tmp_path / "dumps-copy"), "--exact"],
        ["dump", str(tmp_path / "dumps")],
    ):
        done = ftkit_without(none, *args)
        assert done.returncode == 0, (args, done.stderr[-2000:])


def test_pyproject_keeps_the_training_stack_in_an_extra_that_setup_installs():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+, as the tests run
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = {d.split(">")[0].split("=")[0].split("<")[0].strip() for d in project["dependencies"]}
    assert not names & {"torch", "megatron-core", "ray", "transformers"}
    train = " ".join(project["optional-dependencies"]["train"])
    assert all(n in train for n in ("torch", "megatron-core", "ray"))
    assert '-e ".[test,train' in (REPO / "scripts" / "setup.sh").read_text()
