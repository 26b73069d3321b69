"""RankWorker end to end without Ray: events, membership invariance (I3) and TP=2 cells.

Real megatron-core models, real gloo process groups (one spawned process per rank).
"""

import json

import pytest
from safetensors.torch import load_file

from cellrun import events, run_cells

BASE = dict(samples_per_rollout=24, steps_per_rollout=2, micro_shards=6, group_size=4, seed=7,
            response_len=6, dump_what=("activations", "grads", "weights"))


def _cfg(**kw):
    from ftkit.train.config import TrainConfig

    return TrainConfig(**{**BASE, **kw}).model_dump(mode="json")


def _tensor_dir(path):
    """{relative file: {tensor: bytes}} of every safetensors file under ``path``."""
    out = {}
    for f in sorted(path.rglob("*.safetensors")):
        out[str(f.relative_to(path))] = {k: v.numpy().tobytes() for k, v in load_file(f).items()}
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cells")
    return run_cells(tmp, {
        "one": (_cfg(cells=1), [0]),
        "two": (_cfg(cells=2), [0, 1]),
        "three": (_cfg(cells=3), [0, 2, 5]),
    }, steps=2)


@pytest.mark.slow
def test_one_two_and_three_cells_end_bitwise_identical(runs):
    ref = load_file(runs["one"] / "cell0" / "final" / "tp0-pp0.safetensors")
    assert any(k.startswith("optimizer.") and k.endswith("exp_avg_sq") for k in ref)
    assert not any("witness" in k for k in ref)
    for name, cells in (("two", [0, 1]), ("three", [0, 2, 5])):
        for cell in cells:
            got = load_file(runs[name] / f"cell{cell}" / "final" / "tp0-pp0.safetensors")
            assert sorted(got) == sorted(ref)
            for key in ref:
                assert got[key].numpy().tobytes() == ref[key].numpy().tobytes(), f"{name} cell {cell}: {key}"
    # every rank of every run logged the same state fingerprint after each step
    totals = {(e["step"], e["total"]) for r in runs.values() for e in events(r, "state_fingerprint")}
    assert len(totals) == 2 and sorted(s for s, _ in totals) == [0, 1]
    # and the same loss
    losses = {json.dumps([x["loss"] for x in json.loads((runs[n] / f"cell{c}" / "results-r0.json").read_text())])
              for n, c in (("one", 0), ("two", 1), ("three", 5))}
    assert len(losses) == 1


@pytest.mark.slow
def test_dumps_do_not_depend_on_the_cell_count(runs):
    ref = _tensor_dir(runs["one"] / "dumps")
    assert "actor/fwd_bwd/rollout_000000/replicated-tp0-pp0.safetensors" in ref
    assert sum("-ms0" in f for f in ref) == 12          # 2 steps x 6 micro-shards
    for name in ("two", "three"):
        assert _tensor_dir(runs[name] / "dumps") == ref, name


@pytest.mark.slow
def test_worker_events_step_outcome_witness_and_fingerprints(runs):
    run = runs["three"]
    outcomes = events(run, "step_outcome")
    assert {(e["cell"], e["step"], e["outcome"]) for e in outcomes} == \
        {(c, s, "committed") for c in (0, 2, 5) for s in (0, 1)}
    shards = {e["cell"]: e["micro_shards"] for e in outcomes if e["step"] == 0}
    assert shards == {0: [0, 1], 2: [2, 3], 5: [4, 5]}
    for e in events(run, "witness_counts"):
        assert e["ids"] == list(range(12 * e["step"], 12 * e["step"] + 12))    # the step's samples
        assert e["counts"] == [1] * 12                                       # each exactly once
    fp = events(run, "state_fingerprint")[0]
    assert "decoder.layers.0.mlp.linear_fc1.weight" in fp["params"]
    assert "decoder.layers.0.mlp.linear_fc1.weight.exp_avg" in fp["optimizer"]
    assert not any("witness" in k for k in fp["params"])
    written = events(run, "dump_written")
    assert len(written) == 13 and all(e["bytes"] > 0 for e in written)
