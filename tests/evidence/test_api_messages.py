"""Messages an evidence-API user reads (issue 38 item 16), built as the outside testers found
them: a DDP-style client of ``EvidenceRun`` (rank 0 and rank 1 in one process), then the analyzer."""

from __future__ import annotations

import contextlib

import pytest
import torch

from ftkit.analysis.engine import analyze_paths
from ftkit.evidence import EvidenceProfile, EvidenceRun


def _ddp(tmp_path, killed_after: int | None = None, steps: int = 8, sample=lambda step, rank: 2 * step + rank) -> None:
    """Two ranks of a DDP job; rank 1 stops logging after ``killed_after`` (no close: a SIGKILL);
    ``sample(step, rank)``: the id the rank trains at the step (both ranks log the same global
    counts, as the id gather of a real process group gives them)."""
    ranks = [EvidenceRun(tmp_path, EvidenceProfile(), rank=r, world_size=2) for r in (0, 1)]
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ranks[0].allocate(0, range(2 * steps))
    for step in range(steps):
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        alive = ranks if killed_after is None or step <= killed_after else ranks[:1]
        ids = [sample(step, r) for r in (0, 1)]
        uniq = sorted(set(ids))
        counted = (uniq, [ids.count(i) for i in uniq], [float(ids.count(i)) for i in uniq])
        for r in alive:  # step()'s parts, the counts given as a reduced witness gradient would
            r.step_outcome(step)
            r.fingerprint(step, model, opt)
            r.witness_counts(step, ids, counted=counted)
        if killed_after is not None and step == killed_after:
            break
    for r in ranks[:1] if killed_after is not None else ranks:
        r.close()


def test_a_killed_rank_is_named_by_rank_and_last_step(tmp_path) -> None:
    _ddp(tmp_path, killed_after=6)
    cut = [f for f in analyze_paths([tmp_path / "events"]).findings if "without log_closed" in f.message]
    assert len(cut) == 1, cut
    msg = cut[0].message
    assert msg.startswith("rank 1 stopped logging after step 6 without log_closed")
    assert "died or was killed" in msg and "None" not in msg and "trainer-1-0-0" not in msg


def test_allocate_without_witness_counts_is_refused(tmp_path) -> None:
    run = EvidenceRun(tmp_path, EvidenceProfile(witness=False))
    with pytest.raises(ValueError, match=r"allocate\(\) needs witness counts"):
        run.allocate(0, range(256))
    run.close()


def test_an_earlier_session_is_one_value_error_named_once(tmp_path) -> None:
    EvidenceRun(tmp_path).close()
    with pytest.raises(ValueError) as info:
        EvidenceRun(tmp_path)
    assert "earlier session" in str(info.value) and not str(info.value).startswith("ValueError")


def _found(tmp_path, code: str) -> list:
    return [f for f in analyze_paths([tmp_path / "events"]).findings if f.code == code]


@pytest.mark.parametrize(
    "code,sample",
    [("FT103", lambda step, rank: 2 * step if step == 3 else 2 * step + rank),  # id 7 never trained
     ("FT104", lambda step, rank: 2 * step + rank if step != 3 else 6)],  # id 6 twice, 7 never
)  # fmt: skip
def test_witness_hints_speak_to_an_evidence_api_user(tmp_path, code: str, sample) -> None:
    """FT103/FT104 hints told a DDP user about micro-shard redistribution (ftkit train's
    internals): a log of the evidence API gets the data loader's and sampler's causes (an ftkit
    train log keeps its own: tests/analysis/test_finding_lines.py)."""
    _ddp(tmp_path, sample=sample)
    (f,) = _found(tmp_path, code)
    assert "micro-shard" not in f.fix and "sampler" in f.fix, f.fix


def test_no_process_is_named_with_none_in_any_format(tmp_path, capsys) -> None:
    """Log names like ``driver-None-None-0`` / ``trainer-1-0-0``: every format of the analysis of
    a killed rank names the writers as readers do (``rank 1``, ``the driver``)."""
    from ftkit import cli

    _ddp(tmp_path, killed_after=6)
    assert sorted(p.name for p in (tmp_path / "events").iterdir()) == [
        "driver-i0.jsonl",
        "trainer-c0-r0-i0.jsonl",
        "trainer-c1-r0-i0.jsonl",
    ]
    junit = tmp_path / "r.xml"
    for fmt in ("human", "json", "github"):
        assert cli.main(["analyze-events", str(tmp_path / "events"), "-f", fmt, "--junit-xml", str(junit)]) == 1
        out, err = capsys.readouterr()
        for text in (out, err, junit.read_text()):
            assert "None-" not in text and "-None" not in text and "trainer-1-0-0" not in text
        assert "rank 1 stopped logging after step 6" in out


@pytest.mark.parametrize("raised", [False, True])
def test_evidence_run_is_a_context_manager(tmp_path, raised: bool) -> None:
    """docs/library.md: ``with EvidenceRun(...) as run:`` closes the run on leaving the block,
    ``completed``, or ``failed`` with the exception's type when the block raised."""
    import json

    with pytest.raises(KeyError) if raised else contextlib.nullcontext(), EvidenceRun(tmp_path) as run:
        run.step_outcome(0)
        if raised:
            raise KeyError("boom")
    last = json.loads((tmp_path / "events" / "driver-i0.jsonl").read_text().splitlines()[-2])
    assert last["type"] == "run_finished"
    assert (last["status"], last["reason"]) == (("failed", "KeyError") if raised else ("completed", None))
