"""Messages an evidence-API user reads (issue 38 item 16), built as the outside testers found
them: a DDP-style client of ``EvidenceRun`` (rank 0 and rank 1 in one process), then the analyzer."""

from __future__ import annotations

import pytest
import torch

from ftkit.analysis.engine import analyze_paths
from ftkit.evidence import EvidenceProfile, EvidenceRun


def _ddp(tmp_path, killed_after: int | None = None, steps: int = 8) -> None:
    """Two ranks of a DDP job; rank 1 stops logging after ``killed_after`` (no close: a SIGKILL)."""
    ranks = [EvidenceRun(tmp_path, EvidenceProfile(), rank=r, world_size=2) for r in (0, 1)]
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ranks[0].allocate(0, range(2 * steps))
    for step in range(steps):
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        alive = ranks if killed_after is None or step <= killed_after else ranks[:1]
        for r in alive:
            r.step(step, model=model, optimizer=opt, samples=[2 * step + r.rank])
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
