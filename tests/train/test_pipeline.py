"""Pipeline-parallel cells (``--pp 2``) end to end: real Ray actors, real megatron-core stages,
real gloo send/recv between stages. A PP=2 cell runs each micro-shard's exact PP=1 operations,
so it must end bitwise where the PP=1 run of the same seed ends, for any cell count."""

import json

import pytest
import torch
from safetensors.torch import load_file
from test_driver import BASE, events_of, fingerprints, tensors_of

from ftkit.cli import main
from ftkit.model.stages import global_param_name, local_param_name
from ftkit.train.config import TrainConfig
from ftkit.train.control.driver import run_training
from ftkit.train.plan.run_plan import build_plan
from ftkit.train.rank.dumps import capture_name

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
    return {name: run_training(build_plan(TrainConfig(**BASE, **kw, out=root / name))) for name, kw in RUNS.items()}


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


def checkpoint_files(run_dir):
    """``{checkpoint/file: {tensor: tensor}}`` of every published checkpoint's payload."""
    root = run_dir / "checkpoints"
    return {
        f"{d.name}/{f.name}": load_file(f) for d in sorted(root.glob("step_*")) for f in sorted(d.glob("*.safetensors"))
    }


@pytest.mark.slow
def test_tp_and_pp_cells_publish_checkpoints_in_the_tp1_pp1_layout_that_verify(runs):
    for name, ranks in (("pp2_c1", 2), ("pp2_c2", 2), ("tp2", 2), ("tp2pp2", 4)):
        run_dir = runs[name].run_dir
        published = events_of(run_dir, "checkpoint_published")
        assert [e["step"] for e in published] == [1, 3], name
        # the event log included: every rank's total, recomputed from the stored canonical state,
        # is the total that rank logged at the checkpoint's step
        assert main(["verify-checkpoint", str(run_dir)]) == 0, name
        for step in (1, 3):
            man = json.loads((run_dir / "checkpoints" / f"step_{step:06d}" / "MANIFEST.json").read_text())
            assert sorted(man["rank_totals"]) == [str(r) for r in range(ranks)], name
    # PP is layout-exact: the PP=2 checkpoints hold the PP=1 checkpoints' bits (model, optimizer,
    # counters and witness), and TP=2 x PP=2 those of TP=2
    for name, ref in (("pp2_c1", "pp1"), ("pp2_c2", "pp1"), ("tp2pp2", "tp2")):
        got, want = checkpoint_files(runs[name].run_dir), checkpoint_files(runs[ref].run_dir)
        assert sorted(got) == sorted(want) and got, name
        for f in want:
            assert sorted(got[f]) == sorted(want[f]), (name, f)
            assert all(torch.equal(got[f][k], want[f][k]) for k in want[f]), (name, f)
    # TP=2 is not bitwise TP=1 (its all-reduces sum in another order): the same canonical
    # tensors (names, dtypes, shapes) all the same
    tp2, pp1 = checkpoint_files(runs["tp2"].run_dir), checkpoint_files(runs["pp1"].run_dir)
    assert {f: {k: (v.dtype, v.shape) for k, v in t.items()} for f, t in tp2.items()} == {
        f: {k: (v.dtype, v.shape) for k, v in t.items()} for f, t in pp1.items()
    }


def _replay(run_dir, out, *layout):
    """``ftkit dump --from-checkpoint`` of rollout 1 (from the checkpoint of rollout 0); the dump dir."""
    ckpt = run_dir / "checkpoints" / "step_000001"
    assert main(["dump", "--from-checkpoint", str(ckpt), "--rollout", "1", "--out", str(out), *layout]) == 0
    return out / "dumps" / "actor" / "fwd_bwd" / "rollout_000001"


def _live(run_dir):
    return run_dir / "dumps" / "actor" / "fwd_bwd" / "rollout_000001"


@pytest.mark.slow
def test_dump_from_checkpoint_replays_a_live_rollout_bitwise(runs, tmp_path):
    """Rollout 1's recorded batch through the model of the checkpoint taken just before it: the
    replay's dump is the live dump of rollout 1, bit for bit, in the run's layout (TP=1, and a
    PP=2 run replayed as PP=2)."""
    for name in ("pp1", "pp2_c1"):
        replayed = _replay(runs[name].run_dir, tmp_path / name)
        assert main(["compare-dumps", "--exact", str(replayed), str(_live(runs[name].run_dir))]) == 0, name
        doc = json.loads((tmp_path / name / "replay.json").read_text())
        assert doc["steps"] == [2, 3] and doc["layout"]["pp"] == (2 if name == "pp2_c1" else 1)


@pytest.mark.slow
@pytest.mark.full
def test_dump_from_checkpoint_in_another_layout_pairs_tensor_for_tensor(runs, tmp_path):
    """A TP=2 replay of a TP=1 run: every tensor pairs (TP shards reassembled); TP=2 sums its
    all-reduces in another order, so the values agree within a tolerance, not bitwise."""
    replayed = _replay(runs["pp1"].run_dir, tmp_path / "tp2", "--tp", "2")
    live = str(_live(runs["pp1"].run_dir))
    assert main(["compare-dumps", "--rtol", "1e-3", "--atol", "1e-5", str(replayed), live]) == 0
