"""bf16 training of a bf16 Hugging Face checkpoint (issue 37, docs/training.md "Precision"): a
random-init untied GQA Llama saved by transformers in bf16, trained through ``--model DIR
--precision bf16`` by real Ray actors and megatron ranks, checked from artefacts only.

- **Layouts.** Every run analyzes clean (FT114 at TP = 2 with a bf16 ``--logprob-tolerance``)
  and its checkpoints verify. PP=2 is bitwise the PP=1 run
  (dumps, engine weights, losses, checkpoint bits): the activations cross the stages in bf16, as
  they pass between layers in one stage. At TP=2, one cell and two cells end bitwise equal
  (membership invariance at TP > 1 in bf16), training GRPO with a KL term.
- **KL reference.** The GRPO runs' frozen reference model is built as the policy is (bf16, the
  checkpoint's bits): the KL of step 0, before any update, is exactly 0, and positive after.
- **Export.** ``ftkit export`` of the bf16 run writes bf16 (``--dtype auto``): every tensor is the
  final float32 master cast once to bfloat16 (round to nearest even), and transformers loads it
  with exactly those values; ``--dtype fp32`` writes the masters themselves. After ``--lr 0`` the
  export is the source checkpoint byte for byte: imported without upcast, the masters its exact
  upcast, cast back once.

The five runs are shared by the module (100-180 s together on two shared cores).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from faultkit import all_events
from safetensors.torch import load_file
from test_fault_tolerance import weights_sent
from test_hf_faults import BASE, assert_analyzed_clean
from test_pipeline import checkpoint_files, step_metrics

from ftkit.cli import main
from ftkit.train.config import TrainConfig
from ftkit.train.control.driver import run_training
from ftkit.train.plan.run_plan import build_plan
from tests.model.hf_models import make_model

pytestmark = pytest.mark.slow

GRPO_KL = dict(loss="grpo", kl_coef=0.05)  # the frozen reference model in bf16 too
RUNS = {
    "base": dict(cells=2),
    "pp2": dict(cells=1, pp=2),
    "tp2": dict(cells=1, tp=2, **GRPO_KL),
    "tp2c2": dict(cells=2, tp=2, **GRPO_KL),
    "lr0": dict(cells=1, lr=0.0),
}
# FT114 at TP = 2: the engine (TP = 1) and the trainer round the row-parallel sums differently, in
# bf16 by up to 0.008 here (2.4e-7 in fp32), over the default tolerance of 1e-3 (docs/training.md)
TOLERANCE = 0.05


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hf-bf16")
    return make_model("llama", root, eos=True, tie_word_embeddings=False, dtype="bfloat16")


@pytest.fixture(scope="module")
def runs(ray_session, model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("hf-bf16-runs")
    return {
        n: run_training(
            build_plan(
                TrainConfig(**BASE, **kw, model=str(model), precision="bf16", logprob_tolerance=TOLERANCE, out=root / n)
            )
        )
        for n, kw in RUNS.items()
    }


def test_bf16_runs_analyze_clean_and_verify_in_every_layout(runs) -> None:
    for name, kw in RUNS.items():
        assert_analyzed_clean(runs[name], kw["cells"], kw.get("tp", 1) * kw.get("pp", 1))
        assert main(["verify-checkpoint", str(runs[name].run_dir)]) == 0, name
        run_dir = runs[name].run_dir
        assert json.loads((run_dir / "run.json").read_text())["config"]["precision"] == "bf16"
        fp = all_events(run_dir, "state_fingerprint")
        assert fp and all(e["weights"] != e["params"] for e in fp)  # bf16 weights, float32 masters


def test_bf16_pp2_is_bitwise_the_pp1_run(runs) -> None:
    base, split = runs["base"].run_dir, runs["pp2"].run_dir
    assert main(["compare-dumps", "--exact", str(base), str(split)]) == 0
    assert weights_sent(split) == weights_sent(base)
    assert step_metrics(split, "loss") == step_metrics(base, "loss")
    got, want = checkpoint_files(split), checkpoint_files(base)
    assert sorted(got) == sorted(want) and got
    for f, tensors in want.items():
        assert all(torch.equal(got[f][k], t) for k, t in tensors.items()), f


def test_bf16_tp2_one_cell_equals_two_cells_bitwise(runs) -> None:
    one, two = runs["tp2"].run_dir, runs["tp2c2"].run_dir
    assert main(["compare-dumps", "--exact", str(one), str(two)]) == 0
    assert weights_sent(one) == weights_sent(two)
    got, want = checkpoint_files(two), checkpoint_files(one)
    assert sorted(got) == sorted(want) and all(
        torch.equal(got[f][k], t) for f, ts in want.items() for k, t in ts.items()
    )


def test_the_bf16_kl_reference_is_the_initial_bf16_policy(runs) -> None:
    for name in ("tp2", "tp2c2"):
        kl = step_metrics(runs[name].run_dir, "kl")
        assert len(kl) == runs[name].steps_total and kl[0] == 0.0 and all(k > 0 for k in kl[1:]), (name, kl)
    assert step_metrics(runs["tp2"].run_dir, "kl") == step_metrics(runs["tp2c2"].run_dir, "kl")


def test_export_of_a_bf16_run_is_its_masters_cast_once_to_bf16(runs, model: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from ftkit.model.families import load_arch
    from ftkit.model.hf_export import hf_tensors

    run = runs["base"].run_dir
    final = load_file(str(run / "final" / "tp0-pp0.safetensors"))
    masters = hf_tensors(
        [{k[len("model.") :]: t for k, t in final.items() if k.startswith("model.")}], load_arch(model)
    )
    assert {t.dtype for t in masters.values()} == {torch.float32}
    for dtype, torch_dtype in (("auto", torch.bfloat16), ("fp32", torch.float32)):
        out = tmp_path / dtype
        assert main(["export", str(run), "--hf", str(out), "--dtype", dtype]) == 0
        written: dict[str, torch.Tensor] = {}
        for shard in out.glob("model-*.safetensors"):
            written.update(load_file(str(shard)))
        assert set(written) == set(masters)
        for name, master in masters.items():
            assert written[name].dtype == torch_dtype and torch.equal(written[name], master.to(torch_dtype)), name
        assert json.loads((out / "config.json").read_text())["dtype"] == str(torch_dtype).removeprefix("torch.")
        loaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch_dtype).state_dict()
        assert all(torch.equal(loaded[n], t) for n, t in written.items())
    assert any(not torch.equal(m, m.to(torch.bfloat16).float()) for m in masters.values())  # trained off the grid


def test_lr_zero_then_export_is_the_bf16_source_byte_for_byte(runs, model: Path, tmp_path: Path) -> None:
    out = tmp_path / "exported"
    assert main(["export", str(runs["lr0"].run_dir), "--hf", str(out)]) == 0
    source = load_file(str(model / "model.safetensors"))
    written: dict[str, torch.Tensor] = {}
    for shard in out.glob("model-*.safetensors"):
        written.update(load_file(str(shard)))
    assert set(written) == set(source)
    for name, tensor in source.items():
        assert written[name].dtype == torch.bfloat16 and torch.equal(
            written[name].view(torch.int16), tensor.view(torch.int16)
        )
