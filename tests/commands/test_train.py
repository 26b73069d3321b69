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
    code, out, _ = _run(
        capsys,
        "train",
        "--config",
        str(toml),
        "--seed",
        "5",
        "--reduce",
        "float",
        "--dump-what",
        "weights,activations",
        "--print-config",
    )
    cfg = json.loads(out)
    assert code == 0
    assert (cfg["cells"], cfg["micro_shards"], cfg["samples_per_rollout"]) == (3, 6, 48)  # from the file
    assert (cfg["seed"], cfg["reduce"], cfg["dump_what"]) == (5, "float", ["weights", "activations"])  # options
    js = tmp_path / "run.json"
    js.write_text(json.dumps({"model": "small", "dump_rollouts": "all"}))
    code, out, _ = _run(capsys, "train", "--config", str(js), "--dump-what", "none", "--print-config")
    cfg = json.loads(out)
    assert (cfg["model"], cfg["dump_rollouts"], cfg["dump_what"]) == ("small", "all", [])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--cells", "4", "--micro-shards", "2"], "micro_shards (2) must be at least cells (4)"),
        (["--samples-per-rollout", "30"], "must be divisible by steps_per_rollout * micro_shards"),
        (["--tp", "3"], "tp (3) must divide"),
        (["--dump-rollouts", "first,middle"], "'middle' is not 'first', 'last' or a rollout index"),
        (["--dump-what", "grads,logits"], "dump_what"),
        (["--cells", "0"], "cells"),
        (["--pp", "3"], "pp (3) must divide the tiny model's 2 layers"),
        (["--engine", "vllm"], "engine_kind='vllm' needs a Hugging Face model (--model PATH)"),
        (["--engine", "sglang"], "--engine"),
        (["--logprob-tolerance", "0"], "logprob_tolerance"),
        (["--engine-tp", "2"], "engine_tp (2) needs engine_kind='vllm'"),
        (["--engine-tp", "0"], "engine_tp"),
    ],
)
def test_bad_values_are_one_line_and_exit_2(capsys, tmp_path, args, message):
    code, out, err = _run(capsys, "train", "--out", str(tmp_path / "run"), *args)
    assert code == 2 and out == ""
    errors = [line for line in err.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and message in errors[0]
    assert "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_vllm_engine_without_its_virtualenv_is_exit_2_before_anything_starts(capsys, tmp_path, monkeypatch):
    from tests.model.hf_models import make_model

    model = make_model("llama", tmp_path, eos=True)
    capsys.readouterr()  # transformers' progress bar of the save
    monkeypatch.setenv("FTKIT_VLLM_VENV", str(tmp_path / "no-venv"))
    code, out, err = _run(capsys, "train", "--model", str(model), "--engine", "vllm", "--out", str(tmp_path / "run"))
    assert code == 2 and out == ""
    assert err.startswith(f"Error: --engine vllm: no vLLM virtualenv at {tmp_path / 'no-venv'}")
    assert "scripts/setup_vllm.sh" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "etp, message",
    [
        ("3", "engine_tp (3) must divide the model's num_attention_heads (4)"),
        ("8", "engine_tp (8) must divide the model's num_attention_heads (4)"),
    ],
)
def test_an_engine_tp_vllm_cannot_split_the_model_by_is_exit_2(capsys, tmp_path, etp, message):
    from tests.model.hf_models import make_model

    model = make_model("llama", tmp_path, eos=True)
    capsys.readouterr()  # transformers' progress bar of the save
    args = ("--model", str(model), "--engine", "vllm", "--engine-tp", etp, "--out", str(tmp_path / "run"))
    code, out, err = _run(capsys, "train", *args)
    assert code == 2 and out == "" and "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and message in errors[0], err
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
    short = tmp_path / "short.json"
    short.write_text('{"response_len": 2}')
    code, _, err = _run(capsys, "train", "--config", str(short), "--out", str(tmp_path / "run"))
    assert code == 2 and "response_len (2) must be at least 3" in err and not (tmp_path / "run").exists()
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
    code, _, err = _run(
        capsys,
        "train",
        "--out",
        str(out),
        "--cells",
        "20",
        "--micro-shards",
        "20",
        "--samples-per-rollout",
        "40",
        "--tp",
        "2",
    )
    assert code == 2
    line = next(x for x in err.splitlines() if x.startswith("Error: "))
    assert "need 20.5 CPU of Ray resources, the cluster has 8" in line
    assert "Hint: use fewer --cells" in err
    assert not out.exists()


@pytest.mark.slow
def test_a_real_run_reports_progress_and_verdict(tmp_path):
    out, junit = tmp_path / "run", tmp_path / "junit.xml"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ftkit",
            "train",
            "--out",
            str(out),
            "--rollouts",
            "2",
            "--steps-per-rollout",
            "1",
            "--samples-per-rollout",
            "8",
            "--micro-shards",
            "2",
            "--dump-rollouts",
            "last",
            "--junit-xml",
            str(junit),
            "--merged-log",
            str(tmp_path / "events.jsonl.gz"),
        ],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # --merged-log: one file that analyzes like the per-process files (a CI artefact)
    merged = subprocess.run(
        [sys.executable, "-m", "ftkit", "analyze", str(tmp_path / "events.jsonl.gz"), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert merged.returncode == 0 and json.loads(merged.stdout)["verdict"] == "pass", merged.stderr[-2000:]
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


def _result(tmp_path, violation=None):
    """A ``RunResult`` around a synthetic run's analysis (the report renders any analysis)."""
    from ftkit.analysis.engine import analyze_paths
    from ftkit.testing.synthetic import generate
    from ftkit.testing.synthetic_spec import SyntheticSpec
    from ftkit.train.control.driver import RunResult

    generate(
        tmp_path,
        SyntheticSpec(
            cells=2, engines=1, rollouts=2, steps_per_rollout=2, samples_per_rollout=8, faults=0, violation=violation
        ),
    )
    return RunResult(
        tmp_path,
        "synthetic",
        4,
        4,
        1.5,
        [str(tmp_path / "final" / "tp0-pp0.safetensors")],
        [0.25, 0.5],
        [["a" * 32], ["b" * 32], ["c" * 32]],
        analyze_paths([tmp_path / "events"]),
    )


def test_report_formats(tmp_path, capsys, monkeypatch):
    from ftkit.commands.train_report import report
    from ftkit.report.emit import emit
    from ftkit.report.sink import Format, Output

    def render(out, result, outcome):
        return emit(out, report(result, outcome))

    clean = _result(tmp_path / "clean")
    render(Output(Format.json), clean, clean.analysis.verdict())
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema_version"] == 1 and doc["command"] == "train" and doc["verdict"] == "pass"
    assert doc["run"]["rewards"] == [0.25, 0.5] and doc["run"]["engine_fingerprints"][2] == {
        "version": 2,
        "engines": ["c" * 32],
    }
    assert doc["analysis"]["findings"] == [] and len(doc["analysis"]["rules"]) >= 13

    bad = _result(tmp_path / "bad", violation="FT104")
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    render(Output(Format.github), bad, bad.analysis.verdict())
    out = capsys.readouterr().out
    assert any(line.startswith("::error") and "FT104" in line for line in out.splitlines())
    assert "## ftkit train synthetic" in summary.read_text()

    render(Output(Format.human), bad, bad.analysis.verdict())
    text = " ".join(capsys.readouterr().out.split())
    assert "Trained" in text and "4/4 steps committed" in text and "reward per rollout 0.250 -> 0.500" in text
    assert "FAIL" in text and "FT104" in text


def test_fail_on_never_exits_0_and_still_says_fail(tmp_path, capsys):
    from ftkit.commands.train_report import verdict_report
    from ftkit.findings import FailOn
    from ftkit.report.emit import emit
    from ftkit.report.sink import Format, Output

    bad = _result(tmp_path / "bad", violation="FT104")
    assert emit(Output(Format.json), verdict_report(bad, FailOn.never)) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "fail"
    assert emit(Output(Format.json), verdict_report(bad, FailOn.error)) == 1
    capsys.readouterr()
    clean = _result(tmp_path / "clean")
    assert emit(Output(Format.json), verdict_report(clean, FailOn.warning)) == 0


def test_step_line():
    from ftkit.report.live import step_text as step_line
    from ftkit.train.control.driver import StepReport

    line = step_line(
        StepReport(
            rollout=1,
            rollouts=3,
            step=3,
            steps=6,
            attempts=1,
            loss=-0.0123,
            grad_norm=0.5,
            reward=0.25,
            tokens_per_s=1234.5,
            seconds=0.1,
            cells_alive=2,
            cells=2,
        )
    )
    assert line == ("rollout 2/3  step 4/6  loss -0.01230  reward 0.250  grad_norm 0.5  cells 2/2  1,234 tok/s")
    assert "3 attempts" in step_line(StepReport(0, 1, 0, 1, 3, 0.0, float("nan"), 0.0, 0.0, 0.1, 1, 1))
