"""``compare-dumps`` on copies of a real run tampered with (issue 38 items 3 and 8)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tamper_run import copy_run

from ftkit import cli

pytestmark = pytest.mark.slow


def _cli(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("level", ["dumps", "dumps/actor", "rollouts"])
def test_a_symlinked_directory_to_the_other_run_is_refused_at_every_level(
    real_train_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], level: str
) -> None:
    """Item 3: B's ``dumps/`` (or a directory below it, or ``rollouts/``) a symlink to A's made
    ``--exact`` PASS by comparing A with itself; every level is refused, exit 2."""
    a, b = copy_run(real_train_run, tmp_path / "a"), copy_run(real_train_run, tmp_path / "b")
    code, _, _ = _cli(capsys, "compare-dumps", a, b, "--exact")
    assert code == 0
    shutil.rmtree(b / level)
    (b / level).symlink_to(a / level, target_is_directory=True)
    code, out, err = _cli(capsys, "compare-dumps", a, b, "--exact")
    assert code == 2 and "symlinked directory" in err and "PASS" not in out
    code, _, err = _cli(capsys, "compare-dumps", a, b, "--exact", "--follow-symlinks")
    assert code == 2 and "symlinked directory" in err


def test_the_same_tree_twice_is_refused(real_train_run: Path, tmp_path: Path, capsys) -> None:
    a = copy_run(real_train_run, tmp_path / "a")
    (tmp_path / "b").symlink_to(a, target_is_directory=True)
    code, out, err = _cli(capsys, "compare-dumps", a, tmp_path / "b", "--exact")
    assert code == 2 and "same tree" in err and out == ""


@pytest.mark.parametrize("tamper", ["delete", "no-config"])
def test_a_run_json_missing_on_one_side_is_a_finding(
    real_train_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], tamper: str
) -> None:
    """Item 8: B's ``run.json`` deleted (or without its config): the config check could not be
    made; CD014, exit 1, listed first, never a silent pass."""
    a, b = copy_run(real_train_run, tmp_path / "a"), copy_run(real_train_run, tmp_path / "b")
    if tamper == "delete":
        (b / "run.json").unlink()
    else:
        doc = json.loads((b / "run.json").read_text())
        del doc["config"]
        (b / "run.json").write_text(json.dumps(doc))
    code, out, _ = _cli(capsys, "compare-dumps", a, b, "--exact", "--format", "json")
    doc = json.loads(out)
    assert code == 1 and doc["verdict"] == "fail"
    assert doc["findings"][0]["code"] == "CD014" and doc["findings"][0]["evidence"]["side"] == "B"
    assert [f["code"] for f in doc["findings"]] == ["CD014"]
