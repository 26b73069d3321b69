"""The driver refuses to start actors that import another ftkit (``ftkit.train.control.code_identity``)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ftkit.errors import ConfigError
from ftkit.train.control import code_identity
from ftkit.train.control.code_identity import CodeIdentity, check_same_code

ROOT = Path(__file__).resolve().parents[2]


def test_the_digest_is_of_the_sources_wherever_they_are(tmp_path, monkeypatch):
    import ftkit

    here = code_identity.code_identity()
    assert here.path == str(Path(ftkit.__file__).resolve().parent)
    copy = tmp_path / "ftkit"
    shutil.copytree(here.path, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    monkeypatch.setattr(ftkit, "__file__", str(copy / "__init__.py"))
    assert code_identity.code_identity() == CodeIdentity(str(copy), here.digest)  # moved: same code
    (copy / "train" / "control" / "driver.py").write_text(
        (copy / "train" / "control" / "driver.py").read_text() + "\n# changed\n"
    )
    assert code_identity.code_identity().digest != here.digest


@pytest.mark.slow
def test_workers_with_the_driver_s_code_pass_and_other_code_is_named(ray_session):
    check_same_code()  # the session's workers import this checkout
    with pytest.raises(ConfigError) as info:  # a driver whose sources differ from the workers'
        check_same_code(CodeIdentity("/elsewhere/ftkit", "0" * 32))
    assert "/elsewhere/ftkit" in info.value.message and str(ROOT / "ftkit") in info.value.message


@pytest.mark.slow
def test_train_from_inside_another_checkout_is_exit_2_naming_both(tmp_path):
    other = tmp_path / "checkout"
    (other / "ftkit").mkdir(parents=True)
    (other / "ftkit" / "__init__.py").write_text('__version__ = "0.0.0"\n')
    exe = shutil.which("ftkit")
    assert exe is not None, "the ftkit console script is installed by scripts/setup.sh"
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # the driver runs this checkout; Ray's workers see `other` first
    proc = subprocess.run(
        [exe, "train", "--out", str(other / "run"), "--rollouts", "1"],
        cwd=other,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "another ftkit" in errors[0] and str(ROOT / "ftkit") in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr and not (other / "run").exists()


def test_kernels_not_built_are_exit_2_before_anything_starts(tmp_path, monkeypatch, capsys):
    """Not a failure of every cell at its start, retried until no cell is left (exit 1)."""
    import sys

    from ftkit import tensors
    from ftkit.cli import main

    monkeypatch.setitem(sys.modules, "ftkit.tensors._kernels", None)  # as if the .so were absent
    monkeypatch.delattr(tensors, "_kernels", raising=False)
    monkeypatch.delattr(tensors, "kernels", raising=False)
    monkeypatch.delitem(sys.modules, "ftkit.tensors.kernels", raising=False)
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--cells", "1", "--rollouts", "1"]) == 2
    err = capsys.readouterr().err
    assert "Error: ftkit's compiled kernels" in err and "build_ext --inplace" in err and "Traceback" not in err
    assert not out.exists()
