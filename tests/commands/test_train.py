"""``ftkit train`` through the CLI: config resolution (defaults < --config FILE < options),
--print-config, one-line errors with exit 2 before anything is started or written, and one
real run in a subprocess (progress on stderr, report and verdict on stdout, JUnit)."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from ftkit import cli
from ftkit.train.config import TrainConfig


def _run(capsys, *args):
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_print_config_shows_the_defaults_as_json(capsys):
    code, out, err = _run(capsys, "train", "--print-config")
    assert code == 0 and err == ""
    assert TrainConfig.model_validate(json.loads(out)) == TrainConfig()


def test_options_override_the_config_file(capsys, tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('cells = 3\nmicro_shards = 6\nsamples_per_rollout = 48\nseed = 4\ndump_what = ["grads"]\n')
    code, out, _ = _run(capsys, "train", "--config", str(toml), "--seed", "5", "--reduce", "float",
                        "--dump-what", "weights,activations", "--print-config")
    cfg = json.loads(out)
    assert code == 0
    assert (cfg["cells"], cfg["micro_shards"], cfg["samples_per_rollout"]) == (3, 6, 48)  # from the file
    assert (cfg["seed"], cfg["reduce"], cfg["dump_what"]) == (5, "float", ["weights", "activations"])  # options
    js = tmp_path / "run.json"
    js.write_text(json.dumps({"model": "small", "dump_rollouts": "all"}))
    code, out, _ = _run(capsys, "train", "--config", str(js), "--dump-what", "none", "--print-config")
    cfg = json.loads(out)
    assert (cfg["model"], cfg["dump_rollouts"], cfg["dump_what"]) == ("small", "all", [])


@pytest.mark.parametrize("args, message", [
    (["--cells", "4", "--micro-shards", "2"], "micro_shards (2) must be at least cells (4)"),
    (["--samples-per-rollout", "30"], "must be divisible by steps_per_rollout * micro_shards"),
    (["--tp", "3"], "tp (3) must divide"),
    (["--dump-rollouts", "first,middle"], "'middle' is not 'first', 'last' or a rollout index"),
    (["--dump-what", "grads,logits"], "dump_what"),
    (["--cells", "0"], "cells"),
])
def test_bad_values_are_one_line_and_exit_2(capsys, tmp_path, args, message):
    code, out, err = _run(capsys, "train", "--out", str(tmp_path / "run"), *args)
    assert code == 2 and out == ""
    assert err.startswith("Error: ") and message in err.splitlines()[0]
    assert "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_bad_config_files_exit_2(capsys, tmp_path):
    code, _, err = _run(capsys, "train", "--config", str(tmp_path / "missing.toml"))
    assert code == 2 and "cannot read config file" in err
    broken = tmp_path / "broken.toml"
    broken.write_text("cells = = 2\n")
    code, _, err = _run(capsys, "train", "--config", str(broken))
    assert code == 2 and "is not valid TOML" in err
    unknown = tmp_path / "unknown.json"
    unknown.write_text('{"cells": 2, "learning_rate": 0.1}')
    code, _, err = _run(capsys, "train", "--config", str(unknown))
    assert code == 2 and "learning_rate" in err and "Traceback" not in err
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    code, _, err = _run(capsys, "train", "--config", str(listed))
    assert code == 2 and "must hold a table" in err


def test_an_existing_run_directory_needs_overwrite(capsys, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    code, out, err = _run(capsys, "train", "--out", str(run))
    assert code == 2 and out == "" and "already exists" in err and "--overwrite" in err
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    code, _, err = _run(capsys, "train", "--out", str(other), "--overwrite")
    assert code == 2 and "not an ftkit run directory" in err
    assert (other / "keep.txt").read_text() == "mine"


@pytest.mark.slow
def test_more_cells_than_ray_resources_exit_2_and_write_nothing(capsys, tmp_path):
    out = tmp_path / "run"
    code, _, err = _run(capsys, "train", "--out", str(out), "--cells", "20", "--micro-shards", "20",
                        "--samples-per-rollout", "40", "--tp", "2")
    assert code == 2
    line = next(x for x in err.splitlines() if x.startswith("Error: "))
    assert "need 20.5 CPU of Ray resources, the cluster has 8" in line
    assert "Hint: use fewer --cells" in err
    assert not out.exists()


@pytest.mark.slow
def test_a_real_run_reports_progress_and_verdict(tmp_path):
    out, junit = tmp_path / "run", tmp_path / "junit.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "ftkit", "train", "--out", str(out), "--rollouts", "2", "--steps-per-rollout", "1",
         "--samples-per-rollout", "8", "--micro-shards", "2", "--dump-rollouts", "last", "--junit-xml", str(junit)],
        capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # live progress on stderr, one line per step
    assert "rollout 1/2  step 1/2" in proc.stderr and "rollout 2/2  step 2/2" in proc.stderr
    assert "cells 2/2" in proc.stderr and "tok/s" in proc.stderr
    # the report on stdout: the run, then the forensics verdict (Rich may wrap long lines)
    report = " ".join(proc.stdout.split())
    assert f"Trained {out}: 2/2 steps committed" in report
    assert "FT101" in report and "PASS: 0 finding(s)" in report
    assert "rollout 1/2" not in proc.stdout
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("name") == "ftkit.train" and suite.get("failures") == "0" and int(suite.get("tests")) >= 13
    # --dump-rollouts last: only the last rollout was dumped
    assert [p.name for p in (out / "dumps" / "actor" / "fwd_bwd").iterdir()] == ["rollout_000001"]
