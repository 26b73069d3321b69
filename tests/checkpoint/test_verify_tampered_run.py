"""``verify-checkpoint RUN`` on copies of a real ``ftkit train`` run, tampered with the way the
testers of issue 38 (items 4 and 7) found a VERIFIED that should not be: each forgery keeps
everything it can consistent (manifest sha256 in retention.json and in the log, sizes, totals,
``seq`` renumbered), and the checkpoint is still not trusted."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from tamper_run import copy_run, read_log, write_log

from ftkit.checkpoint.verify import verify_path

pytestmark = pytest.mark.slow


@pytest.fixture
def run(real_train_run: Path, tmp_path: Path) -> Path:
    dst = copy_run(real_train_run, tmp_path / "run")
    assert verify_path(dst).findings == []
    return dst


def _records(run: Path) -> list[dict[str, Any]]:
    return json.loads((run / "checkpoints" / "retention.json").read_text())["records"]


def _newest(run: Path) -> str:
    return max(_records(run), key=lambda r: r["step"])["name"]


def _driver(run: Path) -> Path:
    return next((run / "events").glob("driver-*.jsonl"))


def _errors(run: Path) -> list[Any]:
    return [f for f in verify_path(run).findings if f.severity.value == "error"]


def _reseal(run: Path, name: str, man: dict[str, Any]) -> None:
    """Write ``man`` as ``name``'s manifest and carry its new sha256 (and size) everywhere a
    forger can: retention.json's record and the log's checkpoint_published line."""
    raw = json.dumps(man, indent=1, sort_keys=True).encode()
    (run / "checkpoints" / name / "MANIFEST.json").write_bytes(raw)
    sha = hashlib.sha256(raw).hexdigest()
    ret = json.loads((run / "checkpoints" / "retention.json").read_text())
    for rec in ret["records"]:
        if rec["name"] == name:
            rec["manifest_sha256"] = sha
    (run / "checkpoints" / "retention.json").write_text(json.dumps(ret, indent=1, sort_keys=True))
    evs = read_log(_driver(run))
    for e in evs:
        if e["type"] == "checkpoint_published" and Path(e["path"]).name == name:
            e["manifest_sha256"], e["bytes"] = sha, sum(f["size"] for f in man["files"].values())
    write_log(_driver(run), evs)


def _manifest(run: Path, name: str) -> dict[str, Any]:
    return json.loads((run / "checkpoints" / name / "MANIFEST.json").read_text())


def test_a_deleted_driver_log_leaves_every_checkpoint_unpublished(run: Path) -> None:
    _driver(run).unlink()
    errors = _errors(run)
    assert errors and {f.code for f in errors} == {"FT214"}
    assert {f.evidence["checkpoint"] for f in errors if "never published" in f.message} == {
        r["name"] for r in _records(run)
    }


def test_a_removed_publication_with_seq_renumbered_is_not_trusted(run: Path) -> None:
    name = _newest(run)
    evs = [e for e in read_log(_driver(run)) if not (e["type"] == "checkpoint_published" and name in e["path"])]
    write_log(_driver(run), evs, renumber=True)
    errors = _errors(run)
    assert any(f.code == "FT214" and f.evidence.get("checkpoint") == name and "never published" in f.message
               for f in errors)  # fmt: skip


def test_a_payload_group_dropped_with_its_manifest_entry(run: Path) -> None:
    name = _newest(run)
    man = _manifest(run, name)
    del man["files"]["extra.safetensors"]
    (run / "checkpoints" / name / "extra.safetensors").unlink()
    _reseal(run, name, man)
    errors = _errors(run)
    assert [f.code for f in errors] == ["FT218"] and "extra.safetensors" in errors[0].message


def test_a_tensor_changed_with_its_manifest_entry_and_the_logged_totals(run: Path) -> None:
    """Item 7: a tensor of model.safetensors changed, its manifest entry (fingerprint, file
    sha256), state_fingerprint and rank_totals recomputed, and only the ``total`` of the matching
    state_fingerprint lines rewritten: the lines' own entries and the manifest's disagree."""
    import torch
    from safetensors.torch import load_file

    from ftkit.checkpoint.manifest import FileEntry, state_fingerprint
    from ftkit.tensors.fingerprint import fingerprint

    name = _newest(run)
    d = run / "checkpoints" / name
    man = _manifest(run, name)
    entry = man["files"]["model.safetensors"]
    tname = sorted(entry["tensors"])[0]
    before = load_file(str(d / "model.safetensors"))[tname].clone()
    raw = bytearray((d / "model.safetensors").read_bytes())
    hlen = int.from_bytes(raw[:8], "little")
    begin = json.loads(raw[8 : 8 + hlen])[tname]["data_offsets"][0]
    raw[8 + hlen + begin] ^= 0x01  # one bit of the tensor's first element
    (d / "model.safetensors").write_bytes(bytes(raw))
    after = load_file(str(d / "model.safetensors"))[tname]
    assert not torch.equal(before, after)
    entry["tensors"][tname]["fingerprint"] = fingerprint(after)
    entry["sha256"] = hashlib.sha256(raw).hexdigest()
    files = {f: FileEntry.model_validate(e) for f, e in man["files"].items()}
    total = state_fingerprint(files, man["fingerprint_prefixes"])
    old = man["state_fingerprint"]
    man["state_fingerprint"] = total
    man["rank_totals"] = {k: total for k in man["rank_totals"]}
    _reseal(run, name, man)
    for path in (run / "events").glob("trainer-*.jsonl"):
        evs = read_log(path)
        for e in evs:
            if e["type"] == "state_fingerprint" and e["total"] == old:
                e["total"] = total
        write_log(path, evs)
    errors = _errors(run)
    assert {f.code for f in errors} == {"FT214"}
    assert any("forged line" in f.message for f in errors)
    assert any(f.evidence.get("tensor") == f"param/{tname}" for f in errors)


def test_a_deleted_checkpoint_with_its_record_and_keep_last_changed(run: Path) -> None:
    """Item 7: the older checkpoint and its record deleted, ``keep_last`` lowered to 1 so that
    retention.json follows its own policy: the log's last publication kept both, and the run's
    config says keep_last 2."""
    records = sorted(_records(run), key=lambda r: r["step"])
    older, newest = records[0]["name"], records[-1]["name"]
    shutil.rmtree(run / "checkpoints" / older)
    ret = json.loads((run / "checkpoints" / "retention.json").read_text())
    ret["records"] = [r for r in ret["records"] if r["name"] == newest]
    ret["records"][0]["roles"] = ["last", "best"]
    ret["policy"]["keep_last"] = 1
    (run / "checkpoints" / "retention.json").write_text(json.dumps(ret, indent=1, sort_keys=True))
    errors = _errors(run)
    assert {f.code for f in errors} == {"FT211"}
    text = " | ".join(f.message for f in errors)
    assert "last publication" in text and "keep_last" in text


@pytest.mark.parametrize("tamper", ["deleted", "older"])
def test_the_journal_is_reconciled_with_the_log(run: Path, tamper: str) -> None:
    path = run / "checkpoints" / "journal.json"
    if tamper == "deleted":
        path.unlink()
    else:
        doc = json.loads(path.read_text())
        doc["publish"] = sorted(_records(run), key=lambda r: r["step"])[0]["name"]
        path.write_text(json.dumps(doc))
    errors = _errors(run)
    assert [f.code for f in errors] == ["FT213"]


def test_checkpoints_a_symlink(run: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    (run / "checkpoints").rename(elsewhere)
    (run / "checkpoints").symlink_to(elsewhere, target_is_directory=True)
    errors = _errors(run)
    assert [f.code for f in errors] == ["FT211"] and "symbolic link" in errors[0].message
