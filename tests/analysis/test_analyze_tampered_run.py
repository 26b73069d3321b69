"""``analyze-events`` on copies of a real ``ftkit train`` run tampered with the way the testers of
issue 38 found them (items 12, 9 and 10)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from tamper_run import copy_run, read_log, write_log

from ftkit import cli

pytestmark = pytest.mark.slow


def _cli(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def run(real_train_run: Path, tmp_path: Path) -> Path:
    return copy_run(real_train_run, tmp_path / "run")


def _driver(run: Path) -> Path:
    return next((run / "events").glob("driver-*.jsonl"))


@pytest.mark.parametrize("role,field", [("trainer", "cell"), ("engine", "engine")])
def test_a_placement_without_its_index_is_ft111_not_exit_3(run: Path, capsys, role: str, field: str) -> None:
    """Item 12: a placement line of a trainer without ``cell`` (an engine without ``engine``)
    was a KeyError, exit 3."""
    evs = read_log(_driver(run))
    placement = next(e for e in evs if e["type"] == "placement" and e["role"] == role)
    del placement[field]
    write_log(_driver(run), evs)
    code, out, err = _cli(capsys, "analyze-events", run, "--format", "json")
    assert code == 1, err
    found = json.loads(out)["findings"]
    assert [f["code"] for f in found] == ["FT111"] and field in found[0]["message"]


def _cut(run: Path) -> None:
    """Five lines cut from the middle of one rank's log (``seq`` left as it was)."""
    path = sorted((run / "events").glob("trainer-c1-*.jsonl"))[0]
    lines = path.read_text().splitlines(keepends=True)
    del lines[len(lines) // 2 : len(lines) // 2 + 5]
    path.write_text("".join(lines))


def test_a_rule_selection_never_leaves_out_log_integrity(run: Path, capsys) -> None:
    """Item 9: ``--rule FT109`` on a log with 5 lines cut from one rank was a PASS."""
    code, out, _ = _cli(capsys, "analyze-events", run, "--rule", "FT109", "--format", "json")
    assert code == 0 and {r["code"] for r in json.loads(out)["rules"]} == {"FT106", "FT109", "FT111", "FT112"}
    _cut(run)
    code, out, _ = _cli(capsys, "analyze-events", run, "--rule", "FT109", "--format", "json")
    doc = json.loads(out)
    assert code == 1 and doc["verdict"] == "fail" and "FT111" in {f["code"] for f in doc["findings"]}
    code, _, err = _cli(capsys, "analyze-events", run, "--skip-rule", "FT111")
    assert code == 2 and "always run" in err


def test_a_selection_that_checks_nothing_is_exit_2(run: Path, capsys) -> None:
    """Item 9: ``--rule FT107`` (fault recovery) on a run without faults checked nothing."""
    code, out, err = _cli(capsys, "analyze-events", run, "--rule", "FT107")
    assert code == 2 and out == "" and "checked nothing" in err


def test_fail_on_never_sets_the_exit_code_not_the_verdict(run: Path, capsys, tmp_path: Path) -> None:
    """Item 10: every format said PASS under ``--fail-on never`` while JUnit counted failures."""
    _cut(run)
    junit = tmp_path / "r.xml"
    code, out, _ = _cli(capsys, "analyze-events", run, "--fail-on", "never", "--format", "json", "--junit-xml", junit)
    doc = json.loads(out)
    assert code == 0 and doc["verdict"] == "fail"
    failures = sum(int(s.get("failures", 0)) for s in ET.parse(junit).getroot().iter("testsuite"))
    assert failures > 0
    code, out, _ = _cli(capsys, "analyze-events", run, "--fail-on", "never")
    assert code == 0 and out.rstrip().splitlines()[-1].startswith("FAIL")
    code, out, _ = _cli(capsys, "analyze-events", run, "--fail-on", "never", "--format", "github")
    assert code == 0 and "FAIL" in out.rstrip().splitlines()[-1]


def test_weights_sent_are_held_to_the_trainers_committed_state(run: Path, capsys) -> None:
    """Item 5: one tensor's entry bumped in both ``weights_sent`` and ``engine_weights`` of version
    2, both totals recomputed, was a PASS: the weights sent were never compared with the trainers'
    committed fingerprints (in a real log they are equal entry for entry)."""
    from ftkit.tensors.fingerprint import combine

    code, out, _ = _cli(capsys, "analyze-events", run, "--format", "json")
    ft102 = next(r for r in json.loads(out)["rules"] if r["code"] == "FT102")
    assert code == 0 and ft102["findings"] == 0
    name = "decoder.layers.0.mlp.linear_fc1.weight"
    for path in (run / "events").glob("*.jsonl"):
        evs = read_log(path)
        for e in evs:
            if e["type"] in ("weights_sent", "engine_weights") and e["version"] == 2:
                e["params"][name] = "0" * 32
                e["total"] = combine(e["params"])
        write_log(path, evs)
    code, out, _ = _cli(capsys, "analyze-events", run, "--format", "json")
    found = json.loads(out)["findings"]
    assert code == 1 and [f["code"] for f in found] == ["FT102"], found
    assert found[0]["evidence"]["version"] == 2 and found[0]["evidence"]["tensors"] == [name]
    assert "committed state after step 3" in found[0]["message"]


def test_a_forged_evidence_profile_does_not_downgrade_a_train_run(run: Path, capsys) -> None:
    """Item 6: an ``evidence_profile`` line forged into ``ftkit train``'s log (right after
    ``run_started``, seq renumbered) and cell 1's fingerprints and witness counts deleted was a
    PASS ('not covered'): a producer's promises come from the producer that wrote the run, once."""
    evs = read_log(_driver(run))
    forged = {**evs[0], "type": "evidence_profile", "producer": "ftkit.evidence", "kinds": {"metric": 1}}
    for key in ("config", "num_cells", "tp", "pp", "num_engines", "ftkit_version"):
        forged.pop(key)
    write_log(_driver(run), [evs[0], forged, *evs[1:]], renumber=True)
    cell1 = sorted((run / "events").glob("trainer-c1-*.jsonl"))[0]
    kept = [e for e in read_log(cell1) if e["type"] not in ("state_fingerprint", "witness_counts")]
    kept[-1]["lines"] = len(kept) - 1  # log_closed counts what is left
    write_log(cell1, kept, renumber=True)
    code, out, _ = _cli(capsys, "analyze-events", run, "--format", "json")
    doc = json.loads(out)
    assert code == 1 and doc["stats"]["not_covered"] == [] and doc["stats"]["evidence_profile"] is None
    codes = {f["code"] for f in doc["findings"]}
    assert {"FT111", "FT112"} <= codes, doc["findings"]
    assert any("ftkit train wrote" in f["message"] for f in doc["findings"] if f["code"] == "FT111")


def _later_incarnation_counts(run: Path) -> tuple[Path, list[dict], dict]:
    """The log of cell 1's second incarnation (restarted and healed), its events and its first
    ``witness_counts`` line."""
    path = run / "events" / "trainer-c1-r0-i1.jsonl"
    evs = read_log(path)
    counts = [e for e in evs if e["type"] == "witness_counts"]
    assert counts, "the healed incarnation committed no step before the run ended: nothing to tamper with"
    return path, evs, counts[0]


@pytest.mark.parametrize("value", [2.0, "negative"])
def test_a_later_incarnations_witness_contributions_are_checked(
    real_fault_run: Path, tmp_path: Path, capsys, value: float | str
) -> None:
    """Item 5: one sample's contribution in the witness counts of a later incarnation (cell 1
    restarted and healed after a SIGKILL) changed -- doubled, or made negative -- was a PASS:
    contributions were never compared. Every cell reads them from the same reduced gradient, so
    they are equal bit for bit in a real log (the untampered copy passes)."""
    run = copy_run(real_fault_run, tmp_path / "run")
    code, out, _ = _cli(capsys, "analyze-events", run, "--format", "json")
    assert code == 0, json.loads(out)["findings"]
    path, evs, line = _later_incarnation_counts(run)
    c = line["contributions"]
    c[0] = c[0] * 2 if value == 2.0 else -c[0] or -1.0
    write_log(path, evs)
    code, out, _ = _cli(capsys, "analyze-events", run, "--format", "json")
    found = json.loads(out)["findings"]
    assert code == 1, found
    ft101 = [f for f in found if f["code"] == "FT101"]
    assert len(ft101) == 1 and ft101[0]["evidence"]["differs"] == "contributions", found
    assert ft101[0]["evidence"]["step"] == line["step"] and set(ft101[0]["evidence"]["cells"]) == {0, 1}
    # two cells, two reports: which one is "first" (and which file `where` names) is the order the
    # replay met them in, which the processes' timing decides
    assert ft101[0]["evidence"]["file"].rsplit("/", 1)[-1] in {path.name, "trainer-c0-r0-i0.jsonl"}
    if value == "negative":  # no gradient gives that, whoever else reported the step
        assert any(f["code"] == "FT111" and "negative" in f["message"] for f in found), found
