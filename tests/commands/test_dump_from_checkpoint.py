"""``ftkit dump --from-checkpoint``: every unusable input is exit 2 with one Error line and a
Hint, checked before any work (the replay itself runs end to end in tests/train/test_pipeline.py).

The run directory is real in form: a checkpoint published by the library's ``Publisher`` whose
``meta.json`` holds a training config, and a recorded rollout batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ftkit import cli
from ftkit.checkpoint.guard import GuardVerdict
from ftkit.checkpoint.preflight import agree, preflight
from ftkit.checkpoint.publish import Publisher
from ftkit.checkpoint.restore import state_payload
from ftkit.checkpoint.retention import RetentionPolicy
from ftkit.tensors.st import write_safetensors_atomic
from ftkit.train.config import TrainConfig


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """Checkpoint step_000003 (the state after rollout 1 of 2-step rollouts) and rollout 2's batch."""
    run = tmp_path / "run"
    cfg = TrainConfig(steps_per_rollout=2, rollouts=4).model_dump(mode="json")
    p = state_payload(
        {"w": torch.ones(2)}, {"w.step": torch.tensor(4.0)}, {"counters": torch.tensor([3, 1])}, {"config": cfg}
    )
    pub, guard = Publisher(run / "checkpoints", RetentionPolicy(1, 1)), GuardVerdict(0, 3, False)
    assert pub.publish(3, p, guard, agree([preflight(pub.dir, 3, p.nbytes, guard, "r0")]), 0.5, rollout=1).published
    (run / "rollouts").mkdir()
    write_safetensors_atomic(run / "rollouts" / "rollout_000002.safetensors", {"tokens": torch.zeros(2, 3)})
    return run


def _dump(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["dump", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert any(line.startswith("Hint:") for line in lines), err
    errors = [line for line in lines if line.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def test_unusable_inputs_are_exit_2_with_a_hint(run, tmp_path, capsys) -> None:
    ck = str(run / "checkpoints" / "step_000003")
    out = str(tmp_path / "out")
    cases = {
        "no such checkpoint": (["--from-checkpoint", str(run / "checkpoints" / "step_000099"), "--rollout", "2",
                                "--out", out], "no such checkpoint"),
        "not just before": (["--from-checkpoint", ck, "--rollout", "3", "--out", out], "not the state rollout 3"),
        "rollout 0": (["--from-checkpoint", ck, "--rollout", "0", "--out", out], "initial weights"),
        "not recorded": (["--from-checkpoint", ck, "--rollout", "2", "--out", out], None),
        "path too": ([str(run), "--from-checkpoint", ck, "--rollout", "2", "--out", out], "exclude each other"),
        "no rollout": (["--from-checkpoint", ck, "--out", out], "needs --rollout"),
        "offline options alone": ([str(run), "--rollout", "2"], "applies only with --from-checkpoint"),
        "nothing": ([], "missing PATH"),
    }  # fmt: skip
    (run / "rollouts" / "rollout_000002.safetensors").rename(run / "rollout_000002.safetensors")
    for name, (args, text) in cases.items():
        code, stdout, err = _dump(capsys, *args)
        line = _error(err)
        assert code == 2 and stdout == "", (name, code, err)
        assert text is None or text in line, (name, line)
        if name == "not recorded":
            assert "rollout 2 was not recorded" in line
        if name == "not just before":
            assert "--rollout 2" in err  # the hint names the rollout this checkpoint precedes
    assert not (tmp_path / "out").exists()  # nothing was started


def test_a_checkpoint_that_does_not_verify_or_an_used_out_is_exit_2(run, tmp_path, capsys) -> None:
    ck = run / "checkpoints" / "step_000003"
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    code, _, err = _dump(capsys, "--from-checkpoint", str(ck), "--rollout", "2", "--out", str(used))
    assert code == 2 and "not an empty directory" in _error(err) and (used / "keep.txt").read_text() == "mine"
    man = json.loads((ck / "MANIFEST.json").read_text())
    man["step"] = 7
    (ck / "MANIFEST.json").write_text(json.dumps(man))
    code, _, err = _dump(capsys, "--from-checkpoint", str(ck), "--rollout", "2", "--out", str(tmp_path / "new"))
    assert code == 2 and "does not verify: FT202" in _error(err)
