"""The publication flow: phases, preflight agreement, injected ENOSPC at every phase, the NaN
scan, retention (keep-last, keep-best; NaN/inf and tainted never best) and cleanup failures."""

from __future__ import annotations

import json
import math
import os

import pytest
from ckpt_helpers import payload, publish
from safetensors.numpy import load_file

from ftkit.checkpoint.guard import GuardVerdict
from ftkit.checkpoint.layout import FAULT_POINTS
from ftkit.checkpoint.preflight import PreflightVerdict, agree, preflight
from ftkit.checkpoint.publish import Publisher
from ftkit.checkpoint.retention import Record, RetentionPolicy, select
from ftkit.checkpoint.verify import verify_path
from ftkit.tensors.fingerprint import fingerprint_tensors


@pytest.fixture
def ckdir(tmp_path):
    return tmp_path / "run" / "checkpoints"


def _events():
    seen: list[tuple[str, dict]] = []
    return seen, lambda t, f: seen.append((t, f))


def _visible(ckdir):
    return sorted(p.name for p in ckdir.iterdir())


def test_publish_layout_manifest_and_state_fingerprint(ckdir) -> None:
    seen, on_event = _events()
    pub = Publisher(ckdir, RetentionPolicy(), on_event=on_event)
    p = payload(3)
    out = publish(pub, 3, metric=0.25, payload=p)
    assert out.published and out.path == ckdir / "step_000003"
    assert _visible(ckdir) == ["journal.json", "latest", "retention.json", "step_000003"]
    assert os.readlink(ckdir / "latest") == "step_000003"
    files = sorted(p.name for p in out.path.iterdir())
    assert files == ["MANIFEST.json", "meta.json", "model.safetensors", "optimizer.safetensors", "rng.safetensors"]
    man = json.loads((out.path / "MANIFEST.json").read_text())
    assert man["protocol"] == "ftkit.checkpoint/1" and man["step"] == 3 and man["scan"]["clean"]
    assert man["metric"] == {"name": "reward", "value": 0.25}
    # the state fingerprint is what a TP=1/PP=1 rank logs: param/ and optimizer/ prefixes
    model, optim = p.files["model.safetensors"], p.files["optimizer.safetensors"]
    total, _ = fingerprint_tensors({**{f"param/{n}": t for n, t in model.items()},
                                    **{f"optimizer/{n}": t for n, t in optim.items()}})  # fmt: skip
    assert man["state_fingerprint"] == total
    # bitwise round trip through a standard safetensors reader (no pickle involved)
    back = load_file(str(out.path / "optimizer.safetensors"))
    name = "decoder.layers.0.mlp.linear_fc1.weight.exp_avg"
    assert back[name].tobytes() == optim[name].numpy().tobytes()
    assert [t for t, _ in seen] == ["checkpoint_published"]
    ev = seen[0][1]
    assert (ev["step"], ev["guard_from_step"], ev["guard_to_step"]) == (3, 0, 3)
    assert verify_path(ckdir).findings == []


def test_same_state_same_bytes(tmp_path) -> None:
    a = publish(Publisher(tmp_path / "a", RetentionPolicy()), 5)
    b = publish(Publisher(tmp_path / "b", RetentionPolicy()), 5)
    for name in ("model.safetensors", "optimizer.safetensors"):
        assert (a.path / name).read_bytes() == (b.path / name).read_bytes()


def test_one_rank_failing_preflight_means_nobody_serialises(ckdir) -> None:
    seen, on_event = _events()
    pub = Publisher(ckdir, RetentionPolicy(), on_event=on_event)
    p = payload(7)
    gv = GuardVerdict(4, 7, False)
    inject = {"cell1-rank0": "preflight-fail"}
    verdicts = [
        preflight(ckdir, 7, p.nbytes, gv, who, at=lambda point, who=who: inject.get(who))
        for who in ("cell0-rank0", "cell1-rank0", "cell2-rank0")
    ]
    assert [v.ok for v in verdicts] == [True, False, True]
    agreed = agree(verdicts)
    assert not agreed.ok and "cell1-rank0: preflight failure injected" in agreed.reason
    out = pub.publish(7, p, gv, agreed, metric=1.0)
    assert not out.published and "preflight failure injected" in out.reason
    assert _visible(ckdir) == []  # nothing staged, nothing written
    assert seen == [("checkpoint_rejected", {"step": 7, "kind": "latest", "reason": out.reason})]
    assert publish(pub, 11).published  # training goes on: the next boundary publishes


def test_preflight_checks(ckdir) -> None:
    pub = Publisher(ckdir, RetentionPolicy())
    publish(pub, 3)
    tainted = GuardVerdict(4, 7, True, 2, ("step 5: loss",))
    v = preflight(ckdir, 7, 10, tainted, "r0")
    assert not v.ok and "guard: 2 non-finite observation(s) in steps [4, 7] (step 5: loss)" in v.reason
    assert "exists already" in preflight(ckdir, 3, 10, GuardVerdict(0, 3, False), "r0").reason
    assert "not enough free space" in preflight(ckdir, 7, 1 << 62, GuardVerdict(4, 7, False), "r0").reason
    assert "ends at step 6" in preflight(ckdir, 7, 10, GuardVerdict(4, 6, False), "r0").reason
    assert not agree([]).ok


def test_tainted_guard_is_rejected_even_if_agreement_was_forced(ckdir) -> None:
    pub = Publisher(ckdir, RetentionPolicy())
    out = pub.publish(7, payload(7), GuardVerdict(4, 7, True, 1), PreflightVerdict(True, "all"), metric=9.0)
    assert not out.published and out.reason.startswith("guard:")
    assert not ckdir.exists() or _visible(ckdir) == []


@pytest.mark.parametrize("point", [p for p in FAULT_POINTS if p != "publish_cleanup"])
def test_enospc_at_each_phase_rejects_and_leaves_nothing(ckdir, point) -> None:
    seen, on_event = _events()
    pub = Publisher(ckdir, RetentionPolicy(keep_last=1, keep_best=1), on_event=on_event)
    publish(pub, 3, metric=0.5)
    before = {p.name: p.stat().st_mtime_ns for p in ckdir.iterdir()}
    out = publish(pub, 7, metric=0.9, at=lambda p: "enospc" if p == point else None)
    assert not out.published
    assert "No space left on device" in out.reason and point in out.reason
    assert {p.name: p.stat().st_mtime_ns for p in ckdir.iterdir()} == before  # nothing half-published
    assert seen[-1][0] == "checkpoint_rejected"
    assert verify_path(ckdir).findings == []
    assert publish(pub, 11, metric=0.1).published  # and training goes on


def test_enospc_at_cleanup_is_recorded_not_fatal(ckdir) -> None:
    seen, on_event = _events()
    pub = Publisher(ckdir, RetentionPolicy(keep_last=1, keep_best=0), on_event=on_event)
    publish(pub, 3)
    out = publish(pub, 7, at=lambda p: "enospc" if p == "publish_cleanup" else None)
    assert out.published and out.dropped == ["step_000003"]
    assert [f.name for f in out.cleanup_failures] == ["step_000003"]
    assert "Errno 28" in out.cleanup_failures[0].error
    # the publication is logged at its commit point, before the cleanup that then fails
    assert [t for t, _ in seen] == ["checkpoint_published", "checkpoint_published", "checkpoint_cleanup_failed"]
    journal = json.loads((ckdir / "journal.json").read_text())
    assert journal["state"] == "done" and journal["cleanup_failures"][0]["name"] == "step_000003"
    result = verify_path(ckdir)
    assert [f.code for f in result.findings] == ["FT216"]  # a warning: exit 0 with --fail-on error
    assert publish(pub, 11).dropped == ["step_000007"]  # the next transaction retries the failed deletion
    assert _visible(ckdir) == ["journal.json", "latest", "retention.json", "step_000011"]
    assert verify_path(ckdir).findings == []


def test_nan_in_optimizer_state_is_rejected_by_the_scan(ckdir) -> None:
    seen, on_event = _events()
    pub = Publisher(ckdir, RetentionPolicy(), on_event=on_event)
    bad = payload(7, nonfinite="embedding.word_embeddings.weight.exp_avg_sq")
    out = publish(pub, 7, payload=bad)
    assert not out.published
    assert out.reason.startswith("scan: 1 non-finite value(s) in 1 tensor(s), first optimizer.safetensors:")
    assert not ckdir.exists() or _visible(ckdir) == []


def test_retention_keep_last_and_best(ckdir) -> None:
    pub = Publisher(ckdir, RetentionPolicy(keep_last=2, keep_best=1))
    metrics = {3: 0.5, 7: 0.9, 11: math.nan, 15: 0.2, 19: math.inf, 23: 0.1}
    for step, m in metrics.items():
        assert publish(pub, step, metric=m).published
    doc = json.loads((ckdir / "retention.json").read_text())
    roles = {r["name"]: r["roles"] for r in doc["records"]}
    assert roles == {"step_000007": ["best"], "step_000019": ["last"], "step_000023": ["last"]}
    assert sorted(p.name for p in ckdir.glob("step_*")) == sorted(roles)
    assert doc["latest"] == "step_000023" and os.readlink(ckdir / "latest") == "step_000023"
    assert verify_path(ckdir).findings == []


def test_select_never_ranks_nonfinite_or_tainted_best() -> None:
    recs = [
        Record("step_000001", 1, math.inf, False, "x"),
        Record("step_000002", 2, 99.0, True, "x"),  # tainted interval
        Record("step_000003", 3, math.nan, False, "x"),
        Record("step_000004", 4, -math.inf, False, "x"),
        Record("step_000005", 5, 0.3, False, "x"),
        Record("step_000006", 6, None, False, "x"),
    ]
    got = select(recs, RetentionPolicy(keep_last=1, keep_best=3))
    assert got.roles == {"step_000005": ["best"], "step_000006": ["last"]}
    assert got.latest == "step_000006"
    tie = select([Record("a", 1, 1.0, False, "x"), Record("b", 2, 1.0, False, "x"), Record("c", 3, 0.0, False, "x")],
                 RetentionPolicy(keep_last=1, keep_best=1))  # fmt: skip
    assert tie.roles == {"b": ["best"], "c": ["last"]}  # ties go to the newer step
    with pytest.raises(ValueError):
        RetentionPolicy(keep_last=0)


def test_unfinishable_pending_transaction_rejects_instead_of_raising(ckdir) -> None:
    from ftkit.checkpoint import journal

    pub = Publisher(ckdir, RetentionPolicy())
    publish(pub, 3)
    doc = json.loads((ckdir / "retention.json").read_text())
    journal.begin(ckdir, None, doc, doc, [])  # a pending transaction ...
    (ckdir / "retention.json").unlink()
    (ckdir / "retention.json").mkdir()  # ... that cannot be applied (its target is a directory)
    out = publish(pub, 7)
    assert not out.published and out.reason.startswith("the previous retention transaction cannot be finished")
    assert not (ckdir / "step_000007").exists()
    (ckdir / "retention.json").rmdir()
    assert publish(pub, 11).published  # once it can be finished, publication goes on
    assert verify_path(ckdir).findings == []
