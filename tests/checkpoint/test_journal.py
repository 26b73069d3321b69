"""The intent journal: reconcile rolls a pending transaction forward (or back when the checkpoint
it publishes is not intact), removes unrecorded and half-deleted directories and stale staging
of dead writers, re-points ``latest`` and retries failed deletions."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from ckpt_helpers import publish

from ftkit.checkpoint import journal
from ftkit.checkpoint.publish import Publisher
from ftkit.checkpoint.retention import RetentionPolicy, load_records, select
from ftkit.checkpoint.verify import verify_path
from ftkit.fsutil import temp_path


@pytest.fixture
def two(tmp_path):
    """step_000003 and step_000007 published under keep_last=2, keep_best=0."""
    ck = tmp_path / "checkpoints"
    pub = Publisher(ck, RetentionPolicy(keep_last=2, keep_best=0))
    publish(pub, 3)
    publish(pub, 7)
    return ck, pub


def _pending(ck, pub, step):
    """Stage and rename a checkpoint and write its pending journal, then stop (a crash)."""
    out = publish(Publisher(ck.parent / "scratch", pub.policy), step)
    os.rename(out.path, ck / out.path.name)
    old, _ = load_records(ck)
    from ftkit.checkpoint.retention import Record

    rec = Record(out.path.name, step, 0.5, False, out.manifest_sha256)
    before = select(old, pub.policy).to_json(pub.policy)
    after = select([*old, rec], pub.policy)
    return journal.begin(ck, out.path.name, before, after.to_json(pub.policy), after.dropped)


def test_pending_journal_rolls_forward(two) -> None:
    ck, pub = two
    _pending(ck, pub, 11)
    # mid-transition is visible: the journal is pending and the records do not hold step_000011 yet
    assert {f.code for f in verify_path(ck).findings} == {"FT211", "FT213"}
    rep = journal.reconcile(ck)
    assert rep.rolled == "forward"
    assert sorted(p.name for p in ck.glob("step_*")) == ["step_000007", "step_000011"]
    assert os.readlink(ck / "latest") == "step_000011"
    assert json.loads((ck / "journal.json").read_text())["state"] == "done"
    assert verify_path(ck).findings == []
    assert journal.reconcile(ck).rolled is None  # idempotent


def test_pending_journal_rolls_back_when_checkpoint_not_intact(two) -> None:
    ck, pub = two
    _pending(ck, pub, 11)
    (ck / "step_000011" / "MANIFEST.json").write_text("{}")  # not the manifest the journal committed
    rep = journal.reconcile(ck)
    assert rep.rolled == "back" and rep.removed_unrecorded == ["step_000011"]
    assert sorted(p.name for p in ck.glob("step_*")) == ["step_000003", "step_000007"]
    assert os.readlink(ck / "latest") == "step_000007"
    assert verify_path(ck).findings == []


def test_unrecorded_directory_is_removed(two) -> None:
    """Killed after the rename, before the journal: never published, so removed."""
    ck, pub = two
    out = publish(Publisher(ck.parent / "scratch", pub.policy), 11)
    os.rename(out.path, ck / out.path.name)
    assert "FT211" in {f.code for f in verify_path(ck).findings}
    rep = journal.reconcile(ck)
    assert rep.removed_unrecorded == ["step_000011"] and rep.rolled is None
    assert verify_path(ck).findings == []


def test_stale_staging_and_deleting_leftovers_removed_live_ones_kept(two) -> None:
    ck, _ = two
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = temp_path(ck / "step_000011")
    stale = stale.with_name(stale.name.replace(f"-{os.getpid()}-", f"-{int(dead.stdout)}-"))
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"partial")
    live = temp_path(ck / "step_000015")  # this process is alive: a writer in progress
    live.mkdir()
    half = ck / ".deleting-step_000001-abcd"
    half.mkdir()
    (ck / ".deleting-step_000001-abcd" / "x").write_bytes(b"1")
    codes = sorted(f.code for f in verify_path(ck).findings)
    assert codes == ["FT217", "FT217", "FT217"]
    rep = journal.reconcile(ck)
    assert sorted(rep.removed_temps) == sorted([stale.name, half.name])
    assert live.exists() and not stale.exists() and not half.exists()


def test_latest_repointed_and_failed_cleanups_retried(two) -> None:
    ck, _ = two
    journal.set_latest(ck, "step_000003")
    assert "FT212" in {f.code for f in verify_path(ck).findings}
    doc = json.loads((ck / "journal.json").read_text())
    (ck / "step_000001").mkdir()
    doc["cleanup_failures"] = [{"name": "step_000001", "error": "OSError: [Errno 16] busy"}]
    (ck / "journal.json").write_text(json.dumps(doc))
    assert {f.code for f in verify_path(ck).findings} == {"FT212", "FT216"}
    rep = journal.reconcile(ck)
    assert rep.removed_unrecorded == ["step_000001"]
    assert os.readlink(ck / "latest") == "step_000007"
    assert json.loads((ck / "journal.json").read_text())["cleanup_failures"] == []
    assert verify_path(ck).findings == []


def test_reconcile_refuses_malformed_journal(two) -> None:
    ck, _ = two
    (ck / "journal.json").write_text('{"schema": "something else"}')
    with pytest.raises(ValueError):
        journal.reconcile(ck)
