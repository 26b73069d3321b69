"""``verify-checkpoint`` fails closed: one tampering test per condition (FT201-FT217), and the
command's contract (exit 0 / 1 / 2, json, github, JUnit)."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import struct
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from ckpt_helpers import logged_entries, payload, publish

from ftkit import cli
from ftkit.analysis.engine import analyze_paths
from ftkit.checkpoint import manifest as mf
from ftkit.checkpoint.guard import GuardVerdict
from ftkit.checkpoint.publish import Publisher
from ftkit.checkpoint.retention import RetentionPolicy
from ftkit.checkpoint.stfile import FileRecord, digest_st, write_st
from ftkit.checkpoint.verify import verify_path
from ftkit.events.writer import EventWriter

STEPS = (3, 7, 11)


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """A run directory: three published checkpoints and an event log that matches them."""
    run = tmp_path_factory.mktemp("tpl") / "run"
    with (
        EventWriter(run / "events", run="run", role="trainer", cell=0, rank=0) as w,
        EventWriter(run / "events", run="run", role="driver") as driver,
    ):
        pub = Publisher(run / "checkpoints", RetentionPolicy(keep_last=3, keep_best=1),
                        on_event=lambda t, fields: driver.emit(t, **fields))  # fmt: skip
        for i, step in enumerate(STEPS):
            out = publish(pub, step, metric=0.1 * i, guard=GuardVerdict(step - 3, step, False))
            man = json.loads((out.path / "MANIFEST.json").read_text())
            params, optimizer = logged_entries(man)
            w.emit("state_fingerprint", rollout=step // 4, step=step, attempt=0, cell=0, rank=0,
                   total=man["state_fingerprint"], params=params, optimizer=optimizer)  # fmt: skip
    return run


@pytest.fixture
def run(template, tmp_path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(template, dst, symlinks=True)
    return dst


def codes(path: Path, **kw) -> set[str]:
    return {f.code for f in verify_path(path, **kw).findings}


def ck(run: Path, step: int = 7) -> Path:
    return run / "checkpoints" / f"step_{step:06d}"


def relist(d: Path, **changes) -> None:
    """Rewrite the manifest from the files on disk, as a lying writer would (scan kept clean)."""
    man, _ = mf.load(d / "MANIFEST.json")
    records = {}
    for name in man.files:
        p = d / name
        raw = p.read_bytes()
        rec = digest_st(p) if name.endswith(".safetensors") else None
        tensors = {n: t.__class__(t.dtype, t.shape, t.fingerprint, 0) for n, t in rec.tensors.items()} if rec else None
        records[name] = FileRecord(len(raw), hashlib.sha256(raw).hexdigest(), tensors)
    new = mf.build(step=man.step, rollout=man.rollout, created=man.created, records=records,
                   guard=changes.get("guard", man.guard.model_dump()), metric_name=man.metric.name,
                   metric=man.metric.value, prefixes=man.fingerprint_prefixes, rank_totals=man.rank_totals)  # fmt: skip
    (d / "MANIFEST.json").write_bytes(mf.dumps(new))


def flip(p: Path, offset: int) -> None:
    data = bytearray(p.read_bytes())
    data[offset] ^= 0x01
    p.write_bytes(bytes(data))


def test_clean_run_verifies_with_events(run) -> None:
    result = verify_path(run)
    assert result.findings == []
    assert result.stats["events"] and result.stats["checkpoints"] == 3 and result.stats["files"] == 12
    assert {r.status for r in result.rows} == {"ok"}
    assert {r.code: r.checked > 0 for r in result.rules if r.code not in ("FT216", "FT217")} == {
        r.code: True for r in result.rules if r.code not in ("FT216", "FT217")
    }


# --- per checkpoint ---------------------------------------------------------------------------


def test_ft201_no_manifest(run) -> None:
    (ck(run) / "MANIFEST.json").unlink()
    assert codes(ck(run)) == {"FT201"}


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        '{"protocol": "ftkit.checkpoint/2"}',
        "[]",
        '{"protocol": "ftkit.checkpoint/1", "x": 1}',
        "[" * 100_000,
    ],
)
def test_ft202_malformed_manifest(run, text) -> None:
    (ck(run) / "MANIFEST.json").write_text(text)
    assert codes(ck(run)) == {"FT202"}


def test_json_nested_100k_deep_is_a_finding_not_a_crash(run) -> None:
    """meta.json and the retention records nested 100,000 deep: findings, never a RecursionError."""
    from ftkit.checkpoint.layout import META, RETENTION

    (ck(run) / META).write_text("[" * 100_000)
    assert "FT203" in codes(ck(run))  # its sha256 no longer matches the manifest
    (run / "checkpoints" / RETENTION).write_text("{" * 100_000)
    assert "FT211" in codes(run / "checkpoints")


def test_ft202_manifest_disagrees_with_itself(run) -> None:
    doc = json.loads((ck(run) / "MANIFEST.json").read_text())
    doc["state_fingerprint"] = "0" * 32
    (ck(run) / "MANIFEST.json").write_text(json.dumps(doc))
    assert codes(ck(run)) == {"FT202"}
    doc = json.loads((ck(run) / "MANIFEST.json").read_text())
    (ck(run) / "MANIFEST.json").write_text(json.dumps({**doc, "step": 8}))  # not its directory
    assert "FT202" in codes(ck(run))


def test_ft203_size_and_ft207_truncated_or_trailing(run) -> None:
    p = ck(run) / "model.safetensors"
    data = p.read_bytes()
    p.write_bytes(data[:-5])
    assert codes(ck(run)) == {"FT203", "FT207"}
    p.write_bytes(data + b"\0\0\0\0")
    assert codes(ck(run)) == {"FT203", "FT207"}
    (ck(run) / "meta.json").write_text("{}\n")
    assert "FT203" in codes(ck(run))


def test_ft204_hash_and_ft208_fingerprint(run) -> None:
    p = ck(run) / "optimizer.safetensors"
    flip(p, p.stat().st_size - 3)  # one bit of tensor data
    assert codes(ck(run)) == {"FT204", "FT208"}


def test_ft204_hash_of_meta(run) -> None:
    p = ck(run) / "meta.json"
    text = p.read_text()
    p.write_text(text.replace('"abc"', '"abd"'))
    assert codes(ck(run)) == {"FT204"}


def test_ft205_unlisted_file_and_directory(run) -> None:
    (ck(run) / "notes.txt").write_text("hello")
    (ck(run) / "sub").mkdir()
    assert codes(ck(run)) == {"FT205"}
    assert sum(f.code == "FT205" for f in verify_path(ck(run)).findings) == 2


def test_ft205_symlink_and_ft206_missing(run) -> None:
    (ck(run) / "optimizer.safetensors").unlink()
    assert codes(ck(run)) == {"FT206"}
    os.symlink(ck(run, 3) / "optimizer.safetensors", ck(run) / "optimizer.safetensors")
    assert codes(ck(run)) == {"FT206"}  # listed, but a link is not the regular file the manifest lists


def test_ft207_header_offsets_and_bounds(run) -> None:
    p = ck(run) / "model.safetensors"
    data = p.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    first = next(k for k in header if k != "__metadata__")
    header[first]["data_offsets"][0] += 4  # overlap / gap, same header length after padding
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (n - len(raw))
    assert len(raw) == n
    p.write_bytes(data[:8] + raw + data[8 + n :])
    assert codes(ck(run)) == {"FT204", "FT207"}
    p.write_bytes(struct.pack("<Q", 1 << 40) + data[8:])
    assert codes(ck(run)) == {"FT204", "FT207"}


def test_ft208_file_swapped_and_relisted(run) -> None:
    """A consistent lie about sizes and hashes: the tensor fingerprints still catch it... unless
    the manifest is relisted too, in which case the events catch it (FT214)."""
    man, _ = mf.load(ck(run) / "MANIFEST.json")
    other = payload(99).files["optimizer.safetensors"]
    p = ck(run) / "optimizer.safetensors"
    rec = write_st(p, other, {"protocol": "ftkit.checkpoint/1", "step": "7"})
    doc = json.loads((ck(run) / "MANIFEST.json").read_text())
    doc["files"]["optimizer.safetensors"].update(size=rec.size, sha256=rec.sha256)
    (ck(run) / "MANIFEST.json").write_text(json.dumps(doc))
    assert codes(ck(run)) == {"FT208"}
    relist(ck(run))
    assert codes(ck(run)) == set()
    assert codes(ck(run), events=True) == {"FT214"}


def test_ft209_pickle_anywhere(run) -> None:
    (ck(run) / "extra.pt").write_bytes(pickle.dumps({"a": 1}))
    (ck(run) / "sub").mkdir()
    (ck(run) / "sub" / "state.json").write_bytes(pickle.dumps([1, 2], protocol=4))  # by content
    found = verify_path(ck(run)).findings
    assert sum(f.code == "FT209" for f in found) == 2 and {f.code for f in found} == {"FT205", "FT209"}


def test_ft210_nonfinite_in_optimizer_state(run) -> None:
    p = ck(run) / "optimizer.safetensors"
    data = p.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    info = json.loads(data[8 : 8 + n])["decoder.layers.0.mlp.linear_fc1.weight.exp_avg"]
    at = 8 + n + info["data_offsets"][0] + 4 * 5
    p.write_bytes(data[:at] + struct.pack("<f", float("inf")) + data[at + 4 :])
    relist(ck(run))  # the manifest lies: scan clean, fingerprints of the poisoned bytes
    assert codes(ck(run)) == {"FT210"}


def test_ft210_manifest_scan_not_clean(run) -> None:
    doc = json.loads((ck(run) / "MANIFEST.json").read_text())
    doc["scan"] = {"tensors": doc["scan"]["tensors"], "nonfinite": 2, "clean": False}
    (ck(run) / "MANIFEST.json").write_text(json.dumps(doc))
    assert codes(ck(run)) == {"FT210"}


def test_ft215_tainted_guard_in_manifest(run) -> None:
    relist(ck(run), guard={"from_step": 4, "to_step": 7, "tainted": True, "count": 1, "reasons": ["step 5: loss"]})
    assert codes(ck(run)) == {"FT215"}


# --- across checkpoints: retention, latest, journal, leftovers ---------------------------------


def test_ft211_recorded_checkpoint_missing(run) -> None:
    shutil.rmtree(ck(run, 3))
    assert codes(run / "checkpoints") == {"FT211"}


def test_ft211_unrecorded_or_altered(run) -> None:
    shutil.copytree(ck(run, 11), ck(run, 15))
    assert "FT211" in codes(run / "checkpoints")
    shutil.rmtree(ck(run, 15))
    doc = json.loads((ck(run, 3) / "MANIFEST.json").read_text())
    doc["created"] += 1  # still valid, but not the MANIFEST.json retention recorded
    (ck(run, 3) / "MANIFEST.json").write_text(json.dumps(doc))
    assert codes(run / "checkpoints") == {"FT211"}


@pytest.mark.parametrize("edit", ["malformed", "missing", "roles", "latest"])
def test_ft211_retention_records(run, edit) -> None:
    path = run / "checkpoints" / "retention.json"
    doc = json.loads(path.read_text())
    if edit == "malformed":
        path.write_text('{"schema": "ftkit.checkpoint-retention/1", "records": 3}')
    elif edit == "missing":
        path.unlink()
    elif edit == "roles":
        doc["records"][0]["roles"] = ["best"]  # metric 0.0 is not the best one
        path.write_text(json.dumps(doc))
    else:
        doc["latest"] = "step_000003"
        path.write_text(json.dumps(doc))
    assert "FT211" in codes(run / "checkpoints")


@pytest.mark.parametrize("edit", ["older", "file", "missing", "dangling"])
def test_ft212_latest(run, edit) -> None:
    link = run / "checkpoints" / "latest"
    link.unlink()
    if edit == "older":
        os.symlink("step_000003", link)
    elif edit == "file":
        link.write_text("step_000011")
    elif edit == "dangling":
        os.symlink("step_000099", link)
    assert codes(run / "checkpoints") == {"FT212"}


@pytest.mark.parametrize("text", ["pending", "garbage"])
def test_ft213_journal(run, text) -> None:
    path = run / "checkpoints" / "journal.json"
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "state": "pending"}) if text == "pending" else "{oops")
    assert codes(run / "checkpoints") == {"FT213"}


@pytest.mark.parametrize(
    "edit",
    ["rename publish", "rename latest", "rename outcome", "rename cleanup_failures", "latest absent",
     "outcome", "failures", "extra"],
)  # fmt: skip
def test_ft213_finished_journal_contents(run, edit) -> None:
    """Issue 26 item 8: a finished journal holds exactly what ``finish`` writes, and its latest is
    the newest recorded checkpoint."""
    path = run / "checkpoints" / "journal.json"
    doc = json.loads(path.read_text())
    assert doc["state"] == "done" and codes(run / "checkpoints") == set()
    if edit.startswith("rename "):
        key = edit.split()[1]
        doc[key + "s"] = doc.pop(key)
    elif edit == "latest absent":
        doc["latest"] = "step_010015"
    elif edit == "outcome":
        doc["outcome"] = "maybe"
    elif edit == "failures":
        doc["cleanup_failures"] = [{"name": "step_000003"}]
    else:
        doc["note"] = "x"
    path.write_text(json.dumps(doc))
    assert codes(run / "checkpoints") == {"FT213"}


def test_ft216_failed_deletion_is_a_warning(run) -> None:
    path = run / "checkpoints" / "journal.json"
    doc = json.loads(path.read_text())
    (run / "checkpoints" / "step_000001").mkdir()
    path.write_text(json.dumps({**doc, "cleanup_failures": [{"name": "step_000001", "error": "EBUSY"}]}))
    found = verify_path(run / "checkpoints").findings
    assert [(f.code, f.severity.value) for f in found] == [("FT216", "warning")]
    assert cli.main(["verify-checkpoint", str(run)]) == 0
    assert cli.main(["verify-checkpoint", str(run), "--fail-on", "warning"]) == 1


def test_ft217_stale_staging(run) -> None:
    (run / "checkpoints" / ".step_000015.tmp-host-1-abcd").mkdir()
    assert codes(run / "checkpoints") == {"FT217"}


# --- against the event log -------------------------------------------------------------------


def _event(run: Path, type_: str, **fields) -> None:
    with EventWriter(run / "events", run="run", role="trainer", cell=1, rank=0) as w:
        w.emit(type_, **fields)


def test_ft214_fingerprint_differs_from_the_log(run) -> None:
    _event(run, "state_fingerprint", rollout=1, step=7, attempt=0, cell=1, rank=0, total="f" * 32, params={},
           optimizer={})  # fmt: skip
    found = verify_path(run).findings
    assert {f.code for f in found} == {"FT214"} and all("cell 1 rank 0" in f.message for f in found)
    assert any("forged line" in f.message for f in found)  # its total is not its entries' (empty here)


def test_ft214_no_evidence_in_the_log(run) -> None:
    shutil.rmtree(run / "events")
    with EventWriter(run / "events", run="run", role="driver") as w:
        w.emit("run_finished", status="completed")
    found = verify_path(run).findings
    assert [f.code for f in found] == ["FT214"] * 6  # per checkpoint: never published, no fingerprint
    assert sum("never published" in f.message for f in found) == 3
    assert codes(run, events=False) == set()


@pytest.mark.parametrize("kind", ["grad", "metric"])
def test_ft215_nonfinite_in_the_guard_interval_of_the_log(run, kind) -> None:
    if kind == "grad":
        _event(run, "grad_nonfinite", rollout=1, step=5, cell=1, rank=0, where="reduced gradient")
    else:
        _event(run, "metric", rollout=1, step=6, values={"loss": float("nan")})
    found = verify_path(run).findings
    assert [f.code for f in found] == ["FT215"] and "step_000007" in found[0].message


# --- the command ------------------------------------------------------------------------------


def test_cli_exit_codes_and_formats(run, tmp_path, capsys) -> None:
    assert cli.main(["verify-checkpoint", str(run)]) == 0
    out = capsys.readouterr().out
    assert "VERIFIED: 3 checkpoint(s), 12 file(s)" in out and "event log cross-checked" in out
    flip(ck(run) / "meta.json", 3)
    junit = tmp_path / "v.xml"
    assert cli.main(["verify-checkpoint", str(run), "-f", "json", "--junit-xml", str(junit)]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema_version"] == 1 and doc["verdict"] == "fail"
    assert [f["code"] for f in doc["findings"]] == ["FT204"]
    assert {r["code"] for r in doc["rules"]} >= {f"FT2{i:02d}" for i in range(1, 19)}
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "1" and suite.get("tests") == "18"
    assert float(suite.get("time") or 0) > 0  # the verification's seconds (issue 38 item 17)
    assert cli.main(["verify-checkpoint", str(run), "-f", "github"]) == 1
    lines = capsys.readouterr().out.splitlines()
    # the shared output path: file= only inside the workspace (the run lies in a temp dir, so the
    # location is named in the message), the verdict line last
    assert lines[0].startswith("::error ") and "FT204" in lines[0] and str(run) in lines[0]
    assert lines[-1].startswith("::error title=") and "FAILED" in lines[-1]


def test_cli_unusable_input_is_exit_2(run, tmp_path, capsys) -> None:
    assert cli.main(["verify-checkpoint", str(tmp_path / "nope")]) == 2
    (tmp_path / "empty").mkdir()
    assert cli.main(["verify-checkpoint", str(tmp_path / "empty")]) == 2
    shutil.rmtree(run / "events")
    assert cli.main(["verify-checkpoint", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("Error:") == 3 and "Hint:" in err and "Traceback" not in err
    assert cli.main(["verify-checkpoint", str(run), "--no-events"]) == 0


def test_analyzer_counts_a_closed_publication_as_recovery(tmp_path) -> None:
    """A fault at a publish_* point is recovered when the publication ends (rejected or
    published) and training goes on: the analyzer's recovery table says so (no FT113 row)."""
    from ftkit.analysis.engine import analyze_paths

    with EventWriter(tmp_path / "events", run="r", role="driver") as w:
        w.emit("fault_injected", kind="enospc", point="publish_write", cell=None, rank=None, rollout=2, step=5)
        w.emit("checkpoint_rejected", step=5, kind="latest", reason="I/O error: [Errno 28] No space left on device")
        w.emit("fault_injected", kind="sigkill", point="before_forward", cell=0, rank=0, rollout=3, step=6)
    rows = analyze_paths([tmp_path / "events"]).recovery
    assert [(r["point"], r["recovered_by"]) for r in rows] == [("publish_write", "rejected"), ("before_forward", None)]


def _within(seconds: float, fifo: Path, fn):  # noqa: ANN001, ANN202
    """``fn()`` in a thread; if it is still running after ``seconds`` (blocked on ``fifo``), open
    the FIFO's write end to release it and fail the test."""
    import threading

    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        t.join(10)
        pytest.fail(f"blocked on the FIFO {fifo.name} for {seconds} s")
    return out[0]


@pytest.mark.parametrize(
    ("where", "code"),
    [("checkpoints/step_000007/MANIFEST.json", "FT202"), ("checkpoints/journal.json", "FT213"),
     ("checkpoints/retention.json", "FT211")],
)  # fmt: skip
def test_a_fifo_in_place_of_a_bookkeeping_file_is_a_finding_not_a_hang(run, where, code) -> None:
    """Issue 26 item 5: bookkeeping files get the special-file checks of payload files."""
    path = run / where
    path.unlink()
    os.mkfifo(path)
    found = _within(20, path, lambda: verify_path(run).findings)
    assert any(f.code == code and "FIFO" in f.message for f in found), [(f.code, f.message) for f in found]


def test_a_symlinked_manifest_is_refused(run, tmp_path) -> None:
    """Issue 26 item 6: a MANIFEST.json symlinked to an identical copy outside the checkpoint."""
    path = ck(run) / "MANIFEST.json"
    copy = tmp_path / "elsewhere.json"
    shutil.copy(path, copy)
    path.unlink()
    os.symlink(copy, path)
    found = verify_path(run).findings
    assert any(f.code == "FT202" and "symbolic link" in f.message for f in found)
    assert codes(ck(run)) >= {"FT202"}


def test_dump_from_a_checkpoint_with_a_symlinked_manifest_is_refused(run, tmp_path, capsys) -> None:
    """Issue 26 item 6: ``dump --from-checkpoint`` verifies the checkpoint first, and refuses the link."""
    path = ck(run) / "MANIFEST.json"
    copy = tmp_path / "elsewhere.json"
    shutil.copy(path, copy)
    path.unlink()
    os.symlink(copy, path)
    args = ["dump", "--from-checkpoint", str(ck(run)), "--rollout", "2", "--out", str(tmp_path / "replay")]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "does not verify: FT202" in err and "symbolic link" in err


def test_ft214_manifest_sha256_of_the_publication_differs(run) -> None:
    """Issue 26 item 7: the log's checkpoint_published.manifest_sha256 is checked against the manifest."""
    path = next((run / "events").glob("driver-*.jsonl"))
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        ev = json.loads(line)
        if ev["type"] == "checkpoint_published" and ev["step"] == 7:
            sha = ev["manifest_sha256"]
            ev["manifest_sha256"] = ("0" if sha[0] != "0" else "1") + sha[1:]
            lines[i] = json.dumps(ev)
    path.write_text("\n".join(lines) + "\n")
    found = verify_path(run).findings
    assert [f.code for f in found] == ["FT214"] and "checkpoint_published" in found[0].message
    found = analyze_paths([run / "events"], select=["FT110"]).findings  # this log is not a whole run's:
    ft110 = [f.message for f in found if f.code == "FT110"]  # the integrity rules (always run) say so
    assert len(ft110) == 1 and "step_000007/MANIFEST.json has sha256" in ft110[0]


def test_analyzer_finds_no_manifest_problem_in_a_clean_run(run) -> None:
    assert [f for f in analyze_paths([run / "events"], select=["FT110"]).findings if f.code == "FT110"] == []


def test_ft211_a_symlinked_step_directory_is_named_a_link(run, tmp_path) -> None:
    """Issue 26 item 13: a recorded step directory replaced by a link to an identical copy is
    not "absent"; an unrecorded step link is a finding too."""
    away = tmp_path / "away"
    shutil.copytree(ck(run), away)
    shutil.rmtree(ck(run))
    os.symlink(away, ck(run))
    os.symlink(away, ck(run, 99))
    messages = [f.message for f in verify_path(run / "checkpoints").findings if f.code == "FT211"]
    assert any("records step_000007, which is a symbolic link" in m for m in messages)
    assert any(m.startswith("step_000099: a symbolic link") for m in messages)


@pytest.mark.parametrize("point", ["publish_write", "publish_scan", "publish_manifest", "publish_rename"])
def test_an_interrupted_publication_leaves_nothing_and_verify_says_none_was_published(
    tmp_path, capsys, point: str
) -> None:
    """A signal inside a publication (``ftkit train``'s RunInterrupted, Ctrl-C: not an OSError)
    removes the staging directory and is raised; a leftover one (a writer SIGKILLed mid-way) is
    named by verify-checkpoint instead of 'no step_* directory'."""

    def interrupt(at: str) -> None:
        if at == point:
            raise KeyboardInterrupt

    ck = tmp_path / "checkpoints"
    pub = Publisher(ck, RetentionPolicy(keep_last=1, keep_best=1))
    with pytest.raises(KeyboardInterrupt):
        publish(pub, 4, at=interrupt)
    assert [p.name for p in ck.iterdir()] == []
    (ck / ".step_000004.tmp-host-1-abcd").mkdir()
    assert cli.main(["verify-checkpoint", str(ck)]) == 2
    err = capsys.readouterr().err
    assert "none was published" in err and ".step_000004.tmp-host-1-abcd" in err and "Traceback" not in err


def _as_fp1(d: Path, keep_field: bool) -> None:
    """Rewrite ``d``'s manifest as a version before ftkit-fp2 wrote it: every tensor fingerprint
    (and so the state fingerprint) in ftkit-fp1 and, unless ``keep_field``, no
    ``fingerprint_scheme`` key (the field those versions did not have)."""
    from ftkit.checkpoint.stfile import digest_files

    man, _ = mf.load(d / "MANIFEST.json")
    listed = [(d / name, f.tensors is not None) for name, f in man.files.items()]
    records = {p.name: rec for p, rec in digest_files(listed, "ftkit-fp1")}
    new = mf.build(step=man.step, rollout=man.rollout, created=man.created, records=records,
                   guard=man.guard.model_dump(), metric_name=man.metric.name, metric=man.metric.value,
                   prefixes=man.fingerprint_prefixes, rank_totals=man.rank_totals)  # fmt: skip
    doc = json.loads(mf.dumps(new))
    if keep_field:
        assert doc["fingerprint_scheme"] == "ftkit-fp2"  # what build writes: now a lie
    else:
        del doc["fingerprint_scheme"]
    (d / "MANIFEST.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def test_a_checkpoint_of_an_earlier_version_verifies_in_its_own_scheme(run: Path) -> None:
    d = ck(run)
    assert json.loads((d / "MANIFEST.json").read_text())["fingerprint_scheme"] == "ftkit-fp2"
    assert not any(f.severity.value == "error" for f in verify_path(d).findings)
    _as_fp1(d, keep_field=False)  # no field: ftkit-fp1, and its fingerprints are fp1's
    man, _ = mf.load(d / "MANIFEST.json")
    assert man.fingerprint_scheme == "ftkit-fp1"
    assert not any(f.severity.value == "error" for f in verify_path(d).findings)


def test_fingerprints_of_another_scheme_than_the_manifest_names_fail(run: Path) -> None:
    d = ck(run)
    _as_fp1(d, keep_field=True)  # fp1 digests under a manifest that says fp2
    errors = {f.code for f in verify_path(d).findings if f.severity.value == "error"}
    assert errors, "a fingerprint recomputed in the named scheme must disagree"


def test_an_unknown_fingerprint_scheme_is_a_malformed_manifest(run: Path) -> None:
    d = ck(run)
    doc = json.loads((d / "MANIFEST.json").read_text())
    doc["fingerprint_scheme"] = "ftkit-fp9"
    (d / "MANIFEST.json").write_text(json.dumps(doc))
    with pytest.raises(mf.ManifestError):
        mf.load(d / "MANIFEST.json")
