"""Acceptance of ``ftkit train``'s driver: real Ray actors, real megatron-core ranks, real gloo
process groups. Runs share one Ray instance (``ray_session``) and are kept tiny (2 rollouts of
2 steps, 16 samples) for two CPU cores."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from suite import FULL

from ftkit.cli import main
from ftkit.train.config import TrainConfig
from ftkit.train.control.driver import run_training
from ftkit.train.plan.run_plan import build_plan

BASE = dict(rollouts=2, steps_per_rollout=2, samples_per_rollout=16, micro_shards=4, group_size=4, seed=11)
RUNS = {
    "c2": dict(cells=2),
    **({"c2_again": dict(cells=2)} if FULL else {}),  # the same seed twice: the full suite only
    "c1": dict(cells=1),
    "c3": dict(cells=3, engines=2),  # and two engines: generation does not depend on their number
    "tp2": dict(cells=2, tp=2),
}


@pytest.fixture(scope="module")
def runs(ray_session, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return {name: run_training(build_plan(TrainConfig(**BASE, **kw, out=root / name))) for name, kw in RUNS.items()}


def tensors_of(run_dir):
    """``{relative path: {tensor name: (dtype, shape, bytes)}}`` of every safetensors file."""
    out = {}
    for f in sorted(run_dir.rglob("*.safetensors")):
        out[str(f.relative_to(run_dir))] = {
            k: (str(v.dtype), tuple(v.shape), v.numpy().tobytes()) for k, v in load_file(f).items()
        }
    return out


def events_of(run_dir, type_):
    found = []
    for f in sorted((run_dir / "events").glob("*.jsonl")):
        found += [e for e in map(json.loads, f.read_text().splitlines()) if e["type"] == type_]
    return found


def fingerprints(run_dir):
    """``{(step, rank): {total, ...}}`` over every cell (one entry per cell when they agree)."""
    out = {}
    for e in events_of(run_dir, "state_fingerprint"):
        out.setdefault((e["step"], e["rank"]), set()).add(e["total"])
    return out


@pytest.mark.full
@pytest.mark.slow
def test_same_seed_twice_is_bitwise_identical(runs):
    a, b = runs["c2"].run_dir, runs["c2_again"].run_dir
    ta = tensors_of(a)
    assert any(p.startswith("final/") for p in ta) and any(p.startswith("rollouts/") for p in ta)
    assert any(p.startswith("dumps/") for p in ta)
    assert ta == tensors_of(b)
    assert runs["c2"].engine_totals == runs["c2_again"].engine_totals
    assert main(["compare-dumps", "--exact", str(a), str(b)]) == 0


@pytest.mark.slow
def test_one_two_and_three_cells_end_bitwise_identical(runs):
    ref = runs["c2"]
    ref_tensors, ref_fps = tensors_of(ref.run_dir), fingerprints(ref.run_dir)
    assert len(ref_fps) == 4 and all(len(totals) == 1 for totals in ref_fps.values())  # 4 steps, cells agree
    for name in ("c1", "c3"):
        other = runs[name]
        assert other.steps_committed == other.steps_total == 4
        assert tensors_of(other.run_dir) == ref_tensors, name  # final state, dumps, rollouts
        # engine fingerprints: every engine of every run holds the same weights per version
        assert [set(t) for t in other.engine_totals] == [set(t) for t in ref.engine_totals], name
        assert fingerprints(other.run_dir) == ref_fps, name  # every committed step
    # the 3-cell run really split the work: every cell computed micro-shards
    outcomes = events_of(runs["c3"].run_dir, "step_outcome")
    assert {e["cell"] for e in outcomes if e["micro_shards"]} == {0, 1, 2}
    assert [len(t) for t in runs["c3"].engine_totals] == [2, 2, 2]
    assert main(["compare-dumps", "--exact", str(runs["c1"].run_dir), str(runs["c3"].run_dir)]) == 0


@pytest.mark.slow
def test_tp2_cells_train_and_analyze_clean(runs):
    r = runs["tp2"]
    assert r.steps_committed == r.steps_total == 4
    assert [p.rsplit("/", 1)[1] for p in r.final_files] == ["tp0-pp0.safetensors", "tp1-pp0.safetensors"]
    assert r.analysis.findings == []
    # TP ranks hold halves of the split tensors: the TP=1 export the engines got has full shapes
    half = load_file(r.run_dir / "final" / "tp1-pp0.safetensors")
    full = load_file(runs["c2"].run_dir / "final" / "tp0-pp0.safetensors")
    name = "model.decoder.layers.0.mlp.linear_fc1.weight"
    assert half[name].shape[0] * 2 == full[name].shape[0]
    sent = events_of(r.run_dir, "weights_sent")
    assert sent[-1]["params"].keys() == events_of(runs["c2"].run_dir, "weights_sent")[-1]["params"].keys()
    assert len({tuple(t) for t in r.engine_totals}) == len(r.engine_totals)  # every version is new weights


@pytest.mark.slow
def test_every_log_analyzes_clean(runs):
    for name, r in runs.items():
        assert r.analysis.findings == [], name
        assert r.analysis.stats["status"] == "completed"
        assert main(["analyze-events", str(r.run_dir / "events")]) == 0, name


@pytest.mark.slow
def test_every_step_logs_phases_that_add_up_to_its_wall_time(runs):
    """Each driver step metric carries ``phases`` adding up to ``wall_seconds`` (within 10%), the
    rank phases of the step, the rollout's phases on its first step, every micro-shard's seconds;
    the analyzer's stats summarise them (docs/train.md "Where a step's time goes")."""
    r = runs["c2"]
    steps = [e for e in events_of(r.run_dir, "metric") if e["step"] is not None]
    assert [e["step"] for e in steps] == [0, 1, 2, 3]
    for e in steps:
        phases, wall = e["phases"], e["wall_seconds"]
        assert wall > 0 and abs(sum(phases.values()) - wall) <= 0.1 * wall, (e["step"], phases, wall)
        rank = {"prepare", "forward_backward", "reduce", "witness", "optimizer", "fingerprint", "dumps"}
        assert rank | {"wait_peers", "commit_barrier", "membership"} <= phases.keys(), e["step"]
        assert ({"generation", "scoring", "record"} <= phases.keys()) == (e["step"] % 2 == 0)
        assert ("weight_sync" in phases) == (e["step"] == 2)  # after rollout 0, on rollout 1's first step
        shards = e["micro_shard_seconds"]
        assert len(shards) == BASE["micro_shards"] and all(s is not None and s > 0 for s in shards)
    summary = r.analysis.stats["step_phases"]
    assert summary["steps"] == 4 and summary["phases"]["forward_backward"]["max"] > 0
    assert summary["wall"]["total"] == pytest.approx(sum(e["wall_seconds"] for e in steps), abs=1e-5)


def _rewrite(events_dir, type_, change):
    """Apply ``change(event) -> bool`` to every event of ``type_``; returns how many changed."""
    n = 0
    for f in sorted(events_dir.glob("*.jsonl")):
        lines = []
        for line in f.read_text().splitlines():
            e = json.loads(line)
            if e["type"] == type_ and change(e):
                n += 1
                line = json.dumps(e, separators=(",", ":"))
            lines.append(line)
        f.write_text("\n".join(lines) + "\n")
    return n


@pytest.mark.slow
def test_tampered_logs_give_the_matching_finding(runs, tmp_path):
    from ftkit.analysis.engine import analyze_paths

    src = runs["c2"].run_dir / "events"
    flipped = shutil.copytree(src, tmp_path / "flipped")

    def flip(e):
        if e["cell"] == 1 and e["step"] == 2 and e["rank"] == 0:
            from ftkit.tensors.fingerprint import state_total

            name = sorted(e["params"])[0]  # one tensor differs, the total consistent with its parts
            e["params"][name] = ("0" if e["params"][name][0] != "0" else "1") + e["params"][name][1:]
            e["total"] = state_total(e["params"], e["optimizer"])
            return True
        return False

    assert _rewrite(flipped, "state_fingerprint", flip) == 1
    assert {f.code for f in analyze_paths([flipped]).findings} == {"FT101"}
    assert main(["analyze-events", str(flipped)]) == 1

    dropped = shutil.copytree(src, tmp_path / "dropped")
    victim = events_of(runs["c2"].run_dir, "witness_counts")[0]["ids"][3]

    def drop(e):  # every cell reports the same global counts: drop the id everywhere
        if victim not in e["ids"]:
            return False
        i = e["ids"].index(victim)
        for key in ("ids", "counts", "contributions"):
            del e[key][i]
        return True

    assert _rewrite(dropped, "witness_counts", drop) == 2
    findings = analyze_paths([dropped]).findings
    assert {f.code for f in findings} == {"FT103"}
    assert main(["analyze-events", str(dropped)]) == 1


@pytest.mark.slow
def test_run_directory_holds_what_the_docs_say(runs):
    r = runs["c2"]
    doc = json.loads((r.run_dir / "run.json").read_text())
    assert doc["schema"] == "ftkit.run/1" and doc["seed"] == 11 and doc["config"]["cells"] == 2
    assert doc["layout"]["cells"] == 2 and doc["task"]["name"] == "addition" and doc["ftkit_version"]
    names = sorted(p.name for p in (r.run_dir / "events").iterdir())
    assert names == ["driver-i0.jsonl", "engine-r0-i0.jsonl", "trainer-c0-r0-i0.jsonl", "trainer-c1-r0-i0.jsonl"]
    assert "engine-r1-i0.jsonl" in {p.name for p in (runs["c3"].run_dir / "events").iterdir()}
    assert sorted(p.name for p in (r.run_dir / "rollouts").iterdir()) == [
        "rollout_000000.safetensors",
        "rollout_000001.safetensors",
    ]
    batch = load_file(r.run_dir / "rollouts" / "rollout_000001.safetensors")
    assert batch["witness_ids"].tolist() == list(range(16, 32))
    assert torch.equal(batch["rewards"], batch["rewards"].clamp(0, 1))
    dumped = sorted(p.name for p in (r.run_dir / "dumps" / "actor" / "fwd_bwd").iterdir())
    assert dumped == ["rollout_000000", "rollout_000001"]  # first and last by default
    metrics = events_of(r.run_dir, "metric")
    assert {k for m in metrics for k in m["values"]} >= {"loss", "reward", "grad_norm", "tokens_per_s"}
    sent = events_of(r.run_dir, "weights_sent")
    assert [e["version"] for e in sent] == [0, 1, 2]
    assert [e["total"] for e in sent] == [t[0] for t in r.engine_totals]
