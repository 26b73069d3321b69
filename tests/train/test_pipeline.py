"""Pipeline-parallel cells (``--pp 2``) end to end: real Ray actors, real megatron-core stages,
real gloo send/recv between stages. A PP=2 cell runs each micro-shard's exact PP=1 operations,
so it must end bitwise where the PP=1 run of the same seed ends, for any cell count."""

import pytest
import torch
from safetensors.torch import load_file
from test_driver import BASE, events_of, fingerprints, tensors_of

from ftkit.cli import main
from ftkit.model.gpt import global_param_name, local_param_name
from ftkit.train.config import TrainConfig
from ftkit.train.driver import run_training
from ftkit.train.rank_dumps import capture_name

RUNS = {
    "pp1": dict(cells=1),
    "pp2_c1": dict(cells=1, pp=2),
    "pp2_c2": dict(cells=2, pp=2),
    "tp2": dict(cells=1, tp=2, dump_rollouts="none"),
    "tp2pp2": dict(cells=1, tp=2, pp=2, dump_rollouts="none"),
}


@pytest.fixture(scope="module")
def runs(ray_session, tmp_path_factory):
    root = tmp_path_factory.mktemp("pp")
    return {name: run_training(TrainConfig(**BASE, **kw, out=root / name)) for name, kw in RUNS.items()}


def step_metrics(run_dir, key):
    return [e["values"][key] for e in events_of(run_dir, "metric") if e["step"] is not None]


def merged_final(run_dir, tp=0, pp=2):
    """The final state of the TP rank ``tp`` with its stage files joined (named model-wide)."""
    out = {}
    for stage in range(pp):
        part = load_file(run_dir / "final" / f"tp{tp}-pp{stage}.safetensors")
        assert not set(part) & set(out), "two stages wrote the same tensor name"
        out.update(part)
    return out


def test_global_param_name_renumbers_only_decoder_layers():
    assert global_param_name("decoder.layers.0.mlp.linear_fc1.weight", 3) == "decoder.layers.3.mlp.linear_fc1.weight"
    assert (
        global_param_name("decoder.layers.12.self_attention.linear_qkv.bias", 4)
        == "decoder.layers.16.self_attention.linear_qkv.bias"
    )
    assert global_param_name("decoder.final_layernorm.weight", 1) == "decoder.final_layernorm.weight"
    assert global_param_name("embedding.word_embeddings.weight", 1) == "embedding.word_embeddings.weight"
    assert global_param_name("decoder.layers.1.mlp.linear_fc2.weight", 0) == "decoder.layers.1.mlp.linear_fc2.weight"
    # module paths and capture names too, a repeated call's "#n" included; local_param_name inverts it
    assert global_param_name("decoder.layers.1#1.output_grad.0", 2) == "decoder.layers.3#1.output_grad.0"
    assert global_param_name("decoder.layers.1", 2) == "decoder.layers.3"
    assert global_param_name("decoder.layers_x.1.w", 2) == "decoder.layers_x.1.w"
    assert local_param_name("decoder.layers.3.mlp.output", 2) == "decoder.layers.1.mlp.output"
    with pytest.raises(ValueError):
        local_param_name("decoder.layers.1.mlp.output", 2)


def test_capture_names_of_a_stage_are_model_wide_and_non_last_stages_drop_top_level_outputs():
    assert capture_name("decoder.layers.0.mlp.output.0", 2, last_stage=False) == "decoder.layers.2.mlp.output.0"
    assert capture_name("embedding.output", 0, last_stage=False) == "embedding.output"
    for top in ("output", "output_grad", "output.0", "decoder.output", "decoder#1.output_grad.1", "#1.output"):
        assert capture_name(top, 2, last_stage=False) is None, top
        assert capture_name(top, 2, last_stage=True) == top, top
    assert capture_name("decoder.final_layernorm.output", 2, last_stage=True) == "decoder.final_layernorm.output"


@pytest.mark.slow
def test_pp2_cells_analyze_clean_and_end_bitwise_at_the_pp1_state(runs):
    ref = runs["pp1"]
    for name in ("pp2_c1", "pp2_c2", "tp2pp2"):
        r = runs[name]
        assert r.steps_committed == r.steps_total == 4, name
        assert r.analysis.findings == [] and r.analysis.stats["status"] == "completed", name
        assert main(["analyze-events", str(r.run_dir / "events")]) == 0, name
    for name in ("pp2_c1", "pp2_c2"):
        r = runs[name]
        assert [p.rsplit("/", 1)[1] for p in r.final_files] == ["tp0-pp0.safetensors", "tp0-pp1.safetensors"]
        # the engines loaded the PP=1 run's weights, version by version (stages gathered, layers renumbered)
        assert r.engine_totals == ref.engine_totals, name
        # same step losses, bit for bit; the grad norm sums per-stage partial norms (a metric only)
        assert step_metrics(r.run_dir, "loss") == step_metrics(ref.run_dir, "loss"), name
        assert step_metrics(r.run_dir, "grad_norm") == pytest.approx(step_metrics(ref.run_dir, "grad_norm"), rel=1e-5)
        # parameters and AdamW state of both stages are the PP=1 state, bitwise
        want, got = load_file(ref.run_dir / "final" / "tp0-pp0.safetensors"), merged_final(r.run_dir)
        assert sorted(got) == sorted(want)
        assert all(torch.equal(got[k], want[k]) for k in want), name
        # the witness lives with the embedding: only stage 0 counts, and each sample exactly once
        counts = events_of(r.run_dir, "witness_counts")
        assert {e["rank"] for e in counts} == {0} and {c for e in counts for c in e["counts"]} == {1}
    # membership invariance: 1 and 2 PP cells hold the same bits everywhere (state, dumps, rollouts)
    one, two = runs["pp2_c1"].run_dir, runs["pp2_c2"].run_dir
    t1 = tensors_of(one)
    assert "dumps/actor/fwd_bwd/rollout_000000/replicated-tp0-pp1.safetensors" in t1
    assert any(p.endswith("-ms003-tp0-pp1.safetensors") for p in t1)
    assert t1 == tensors_of(two)
    assert fingerprints(one) == fingerprints(two) and all(len(v) == 1 for v in fingerprints(two).values())
    # dumps and final state are named model-wide: 1 vs 2 PP cells, and PP=2 vs PP=1, compare
    # exactly (stage 1's layers never collide with stage 0's, non-last stages dump no top-level output)
    assert main(["compare-dumps", "--exact", str(one), str(two)]) == 0
    assert main(["compare-dumps", "--exact", str(one), str(ref.run_dir)]) == 0


@pytest.mark.slow
def test_tp2_pp2_cell_ends_bitwise_at_the_tp2_state(runs):
    tp2, both = runs["tp2"], runs["tp2pp2"]
    assert len(both.final_files) == 4
    assert both.engine_totals == tp2.engine_totals
    assert step_metrics(both.run_dir, "loss") == step_metrics(tp2.run_dir, "loss")
    for tp in (0, 1):
        want = load_file(tp2.run_dir / "final" / f"tp{tp}-pp0.safetensors")
        got = merged_final(both.run_dir, tp=tp)
        assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want), tp
    # megatron's rank order puts TP innermost: ranks 0 and 1 are stage 0, the witness stage
    assert {e["rank"] for e in events_of(both.run_dir, "witness_counts")} == {0, 1}
