"""RankWorker end to end without Ray: events, membership invariance (I3) and TP=2 cells.

Real megatron-core models, real gloo process groups: one spawned process per rank, all
runs of this module in one batch of processes (see ``cellrun``). In the full suite
(``FTKIT_FULL_TESTS=1``): CI proves the same at the driver's level, through Ray
(``test_driver``: 1, 2 and 3 cells bitwise, TP=2, every log clean; ``test_fault_matrix``: a NaN
attempt discarded; ``test_pipeline``: TP x PP cells publish the TP=1 layout).
"""

import json

import pytest
import torch
from cellrun import events, run_cells
from safetensors.torch import load_file

pytestmark = pytest.mark.full

BASE = dict(
    samples_per_rollout=24,
    steps_per_rollout=2,
    micro_shards=6,
    group_size=4,
    seed=7,
    lr=1e-3,
    response_len=6,
    dump_what=("activations", "grads", "weights"),
)


def _cfg(**kw):
    from ftkit.train.config import TrainConfig

    return TrainConfig(**{**BASE, **kw}).model_dump(mode="json")


def _tensor_dir(path):
    """{relative file: {tensor: bytes}} of every safetensors file under ``path``."""
    out = {}
    for f in sorted(path.rglob("*.safetensors")):
        out[str(f.relative_to(path))] = {k: v.numpy().tobytes() for k, v in load_file(f).items()}
    return out


def _final(run, cell, tp=0):
    return load_file(run / f"cell{cell}" / "final" / f"tp{tp}-pp0.safetensors")


def _losses(run, cell):
    return [x["loss"] for x in json.loads((run / f"cell{cell}" / "results-r0.json").read_text())]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cells")
    return run_cells(
        tmp,
        {
            "one": (_cfg(cells=1), [0], 2),
            "two": (_cfg(cells=2), [0, 1], 2),
            "three": (_cfg(cells=3), [0, 2, 5], 2),
            "one_init": (_cfg(cells=1, dump_rollouts="none"), [0], 0),
            "tp2_init": (_cfg(cells=1, tp=2, dump_rollouts="none"), [0], 0),
            "tp2": (_cfg(cells=2, tp=2, dump_rollouts="none"), [0, 1], 2),
            "nan": (_cfg(cells=2), [0, 1], 2, 1),
            "pp2": (_cfg(cells=1, pp=2, dump_rollouts="none"), [0], 1),
        },
    )


@pytest.mark.slow
def test_one_two_and_three_cells_end_bitwise_identical(runs):
    ref = _final(runs["one"], 0)
    assert any(k.startswith("optimizer.") and k.endswith("exp_avg_sq") for k in ref)
    assert not any("witness" in k for k in ref)
    for name, cells in (("two", [0, 1]), ("three", [0, 2, 5])):
        for cell in cells:
            got = _final(runs[name], cell)
            assert sorted(got) == sorted(ref)
            for key in ref:
                assert got[key].numpy().tobytes() == ref[key].numpy().tobytes(), f"{name} cell {cell}: {key}"
    # every rank of every run logged the same state fingerprint after each step, and the same loss
    totals = {(e["step"], e["total"]) for n in ("one", "two", "three") for e in events(runs[n], "state_fingerprint")}
    assert sorted(s for s, _ in totals) == [0, 1]
    assert _losses(runs["one"], 0) == _losses(runs["two"], 1) == _losses(runs["three"], 5)
    # dumps: the same files holding the same bits, whichever cell wrote each micro-shard
    dumps = _tensor_dir(runs["one"] / "dumps")
    assert "actor/fwd_bwd/rollout_000000/replicated-tp0-pp0.safetensors" in dumps
    assert sum("-ms0" in f for f in dumps) == 12  # 2 steps x 6 micro-shards
    for name in ("two", "three"):
        assert _tensor_dir(runs[name] / "dumps") == dumps, name


@pytest.mark.slow
def test_worker_events_step_outcome_witness_and_fingerprints(runs):
    run = runs["three"]
    outcomes = events(run, "step_outcome")
    assert {(e["cell"], e["step"], e["outcome"]) for e in outcomes} == {
        (c, s, "committed") for c in (0, 2, 5) for s in (0, 1)
    }
    assert {e["cell"]: e["micro_shards"] for e in outcomes if e["step"] == 0} == {0: [0, 1], 2: [2, 3], 5: [4, 5]}
    counts = events(run, "witness_counts")
    assert len(counts) == 6
    for e in counts:
        assert e["ids"] == list(range(12 * e["step"], 12 * e["step"] + 12))  # the step's samples
        assert e["counts"] == [1] * 12  # each exactly once
    fp = events(run, "state_fingerprint")[0]
    assert "decoder.layers.0.mlp.linear_fc1.weight" in fp["params"]
    assert "decoder.layers.0.mlp.linear_fc1.weight.exp_avg" in fp["optimizer"]
    assert not any("witness" in k for k in fp["params"])
    written = events(run, "dump_written")
    assert len(written) == 13 and all(e["bytes"] > 0 for e in written)


@pytest.mark.slow
def test_a_nonfinite_attempt_is_discarded_by_every_cell_and_leaves_no_trace(runs):
    run = runs["nan"]
    outcomes = sorted((e["step"], e["attempt"], e["cell"], e["outcome"]) for e in events(run, "step_outcome"))
    assert outcomes == [
        (0, 0, 0, "committed"),
        (0, 0, 1, "committed"),
        (1, 0, 0, "discarded"),
        (1, 0, 1, "discarded"),  # NaN only in cell 1's shard
        (1, 1, 0, "committed"),
        (1, 1, 1, "committed"),
    ]
    assert {(e["step"], e["cell"]) for e in events(run, "grad_nonfinite")} == {(1, 0), (1, 1)}
    assert {(e["step"], e["attempt"]) for e in events(run, "witness_counts")} == {(0, 0), (1, 1)}
    assert [r["committed"] for r in json.loads((run / "cell0" / "results-r0.json").read_text())] == [True, False, True]
    # the retried step ends exactly where the fault-free run does
    ref = _final(runs["one"], 0)
    for cell in (0, 1):
        got = _final(run, cell)
        assert all(torch.equal(got[k], ref[k]) for k in ref)


@pytest.mark.slow
def test_tp2_cells_export_the_tp1_layout_and_train_like_tp1(runs):
    # Same seed: the TP=2 cell holds exactly the slices of the TP=1 model, so the gathered
    # export (fused QKV, vocab-split embedding and output layer included) is bitwise TP=1.
    init1 = load_file(runs["one_init"] / "cell0" / "export.safetensors")
    init2 = load_file(runs["tp2_init"] / "cell0" / "export.safetensors")
    assert sorted(init1) == sorted(init2)
    for k in init1:
        assert torch.equal(init1[k], init2[k]), k
    # After two steps both TP=2 cells agree bitwise, rank by rank (I1), and match TP=1 closely.
    for tp in (0, 1):
        a, b = _final(runs["tp2"], 0, tp), _final(runs["tp2"], 1, tp)
        assert all(torch.equal(a[k], b[k]) for k in a)
    one = load_file(runs["one"] / "cell0" / "export.safetensors")
    two = load_file(runs["tp2"] / "cell0" / "export.safetensors")
    moved = 0
    for k in one:
        assert one[k].shape == two[k].shape, k
        # two AdamW steps move every weight by ~2 * lr = 2e-3; TP=2 (other matmul splits) must
        # agree with TP=1 to 1% of that movement
        assert torch.allclose(one[k], two[k], rtol=0, atol=2e-5), k
        moved += int(not torch.equal(two[k], init2[k]))
    assert moved == len(one)  # training changed every tensor
    assert _losses(runs["tp2"], 0) == pytest.approx(_losses(runs["one"], 0), rel=1e-4, abs=1e-6)
    assert {e["counts"] == [1] * 12 for e in events(runs["tp2"], "witness_counts")} == {True}


@pytest.mark.slow
def test_local_state_of_the_gathered_canonical_state_is_each_ranks_own_state(runs):
    """``canonical_state.local_state(gather(x))`` is ``x`` on every rank, bit for bit, after
    training (optimizer moments and steps included): TP=1, TP=2 (two cells) and PP=2."""
    one = load_file(runs["one"] / "cell0" / "canonical.safetensors")
    for name, cells, ranks in (("one", [0], 1), ("tp2", [0, 1], 2), ("pp2", [0], 2)):
        for cell in cells:
            out = runs[name] / f"cell{cell}"
            for rank in range(ranks):
                doc = json.loads((out / f"roundtrip-r{rank}.json").read_text())
                assert doc["equal"] and doc["optimizer"] == 3 * doc["params"], (name, cell, rank, doc)
            canonical = load_file(out / "canonical.safetensors")
            # every layout gathers the same canonical names and shapes as the TP=1 cell
            assert {k: v.shape for k, v in canonical.items()} == {k: v.shape for k, v in one.items()}, name
