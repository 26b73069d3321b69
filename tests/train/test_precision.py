"""``--precision`` (issue 37): the config field and its place, ``auto`` resolved once by the plan,
the resume refusal (like a layout change, ``--allow-precision-change``), and the rank's fp32
masters and bf16 gradient staging (``ftkit.train.rank.precision``), exact by construction."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ftkit.cli import main
from ftkit.errors import ConfigError
from ftkit.train.config import TrainConfig
from ftkit.train.config.places import FIXED_FIELDS, PRECISION_FIELDS
from ftkit.train.plan.run_plan import build_plan, resolve_precision
from ftkit.train.rank.precision import GradStage, recast, split_masters
from ftkit.train.rank.reducer import GradLayout
from ftkit.train.recovery.resume_plan import plan_resume, resume_config


def test_precision_has_its_own_resume_place_and_is_resolved_by_the_plan() -> None:
    assert {"precision"} == PRECISION_FIELDS and "precision" not in FIXED_FIELDS
    assert resolve_precision("auto", "cpu") == "fp32" and resolve_precision("auto", "cuda") == "bf16"
    assert build_plan(TrainConfig(device="cpu")).config.precision.precision == "fp32"  # recorded resolved
    plan = build_plan(TrainConfig(device="cpu", precision="bf16"))
    assert plan.precision == "bf16" and plan.config.model_dump()["precision"] == "bf16"


def test_the_default_logprob_tolerance_is_the_precisions_and_a_given_one_wins() -> None:
    """bf16 moves a TP=2 trainer's log-probs up to 0.008 from a TP=1 engine's: fp32's 1e-3 would
    make FT114 warn on every such run (docs/training.md)."""
    tolerance = {p: build_plan(TrainConfig(device="cpu", precision=p)).config.model_dump()["logprob_tolerance"]
                 for p in ("fp32", "bf16")}  # fmt: skip
    assert tolerance == {"fp32": 1e-3, "bf16": 5e-2}  # recorded resolved, as run.json holds it
    given = build_plan(TrainConfig(device="cpu", precision="bf16", logprob_tolerance=0.2)).config
    assert given.generation.logprob_tolerance == 0.2


def _run_dir(tmp_path: Path, **kw: object) -> Path:
    from ftkit.tasks.addition import AdditionTask
    from ftkit.train.control.rundir import write_run_json

    run = tmp_path / "run"
    run.mkdir()
    cfg = build_plan(TrainConfig(out=run, rollouts=2, seed=5, device="cpu", **kw)).config
    write_run_json(run, cfg, "cpu", AdditionTask(cfg.task.response_len))
    return run


def test_a_precision_change_on_resume_is_refused_unless_asked_for(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    with pytest.raises(ConfigError, match="precision is 'fp32' .* a precision change") as err:
        resume_config(run, {"precision": "bf16"})
    assert "--allow-precision-change" in (err.value.hint or "")
    with pytest.raises(ConfigError, match="a layout change"):  # one opt-in does not stand for the other
        resume_config(run, {"tp": 2}, allow_precision_change=True)
    cfg = resume_config(run, {"precision": "bf16"}, allow_precision_change=True)
    warnings: list[str] = []
    plan = plan_resume(run, build_plan(cfg).config, warnings.append)
    assert plan.precision_change == ["fp32", "bf16"] and plan.fields()["precision_change"] == ["fp32", "bf16"]
    assert len(warnings) == 1 and "precision change on resume (fp32 -> bf16" in warnings[0]
    same = plan_resume(run, build_plan(resume_config(run, {})).config, warnings.append)
    assert "precision_change" not in same.fields() and len(warnings) == 1


def test_a_run_recorded_before_the_field_resumes_in_fp32(tmp_path: Path) -> None:
    import json

    run = _run_dir(tmp_path)
    record = json.loads((run / "run.json").read_text())
    del record["config"]["precision"]
    (run / "run.json").write_text(json.dumps(record))
    assert resume_config(run, {}).precision.precision == "fp32"  # never 'auto' (bf16 on a GPU)


def test_the_command_line_refuses_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run_dir(tmp_path)
    assert main(["train", "--resume", str(run), "--precision", "bf16", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "Error: --resume: precision is 'fp32'" in err and "--allow-precision-change" in err
    assert "Traceback" not in err
    assert main(["train", "--allow-precision-change", "--print-config"]) == 2
    assert "--allow-precision-change goes with --resume" in capsys.readouterr().err


def test_masters_are_float32_copies_and_the_weights_their_rounding() -> None:
    model = torch.nn.Linear(4, 3)
    model.weight.tensor_model_parallel = True  # a megatron attribute travels with the master
    built = {n: p.detach().clone() for n, p in model.named_parameters()}
    weights, masters = split_masters(model, "bf16")
    assert [n for n, _ in weights] == [n for n, _ in masters] == list(built)
    for (n, w), (_, m) in zip(weights, masters):
        assert m.dtype == torch.float32 and torch.equal(m, built[n]) and w.dtype == torch.bfloat16
        assert torch.equal(w, built[n].to(torch.bfloat16))
    assert dict(masters)["weight"].tensor_model_parallel is True
    with torch.no_grad():
        dict(masters)["weight"].add_(1.0 / 3)
    recast(weights, masters)
    assert torch.equal(dict(weights)["weight"], dict(masters)["weight"].to(torch.bfloat16))
    fp32 = torch.nn.Linear(2, 2)
    w32, m32 = split_masters(fp32, "fp32")
    assert w32 is m32 and all(p.dtype == torch.float32 for _, p in w32)  # fp32: the model's own, untouched


def test_bf16_gradients_land_exactly_in_the_float32_row_beside_the_witness() -> None:
    model = torch.nn.Linear(5, 3)
    weights, _ = split_masters(model, "bf16")
    witness = torch.nn.Parameter(torch.zeros(2, 2))
    layout = GradLayout.of([(n, tuple(p.shape)) for n, p in weights] + [("witness", (2, 2))])
    stage = GradStage(layout, "bf16", "cpu")
    row = torch.zeros(layout.numel)
    stage.bind(row, weights, witness)
    x = torch.randn(7, 5, dtype=torch.bfloat16)
    (model(x).float().pow(2).sum() + (witness * torch.tensor([[1.0, 2.0], [3.0, 4.0]])).sum()).backward()
    assert stage.holds(row, weights, witness)
    grads = {n: p.grad.clone() for n, p in weights}
    stage.land(row)
    landed = layout.unflatten(row)
    for n, g in grads.items():
        assert g.dtype == torch.bfloat16 and torch.equal(landed[n], g.float())  # bf16 -> fp32 is exact
    assert torch.equal(landed["witness"], torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    weights[0][1].grad = torch.zeros_like(weights[0][1])  # autograd replaced a .grad: detected
    assert not stage.holds(row, weights, witness)


def test_bf16_on_a_gpu_without_native_bf16_is_one_exit_2_line_and_auto_is_fp32_there(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Tesla V100-SXM2-16GB")
    assert main(["train", "--device", "cuda", "--precision", "bf16", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "Error: precision: bf16, but the CUDA device Tesla V100-SXM2-16GB has no bf16 support" in err
    assert "--precision fp32" in err and "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("Error:")] == [err.splitlines()[0]]
    assert resolve_precision("auto", "cuda") == "fp32"  # auto: no native bf16 (emulated is slower than fp32)
    assert resolve_precision("fp32", "cuda") == "fp32" and resolve_precision("bf16", "cpu") == "bf16"
