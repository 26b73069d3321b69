"""FT114 compares every cell's trainer canary scores, not only the first cell's: replicas hold the
same bits and score the canary set to the same bits (issue 38 item 5). Built the way it was found:
a real-shaped log (the synthetic generator's, canaries from every cell) with one cell's canary
scores of one version changed."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ftkit.analysis.engine import analyze_paths
from ftkit.testing.synthetic import generate
from ftkit.testing.synthetic_spec import SyntheticSpec


def _run(tmp_path: Path) -> Path:
    spec = SyntheticSpec(cells=3, faults=0, tensors=4, rollouts=3, engines=1, steps_per_rollout=2)
    return generate(tmp_path / "run", spec).events_dir


def _trainer_canaries(events: Path) -> list[tuple[Path, int, dict]]:
    out = []
    for path in sorted(events.glob("trainer-*.jsonl")):
        for i, line in enumerate(path.read_text().splitlines()):
            ev = json.loads(line)
            if ev["type"] == "canary_logprobs":
                out.append((path, i, ev))
    return out


def test_every_cells_canary_is_compared(tmp_path: Path) -> None:
    events = _run(tmp_path)
    canaries = _trainer_canaries(events)
    assert len({ev["cell"] for _, _, ev in canaries}) == 3  # every cell scores the canary set
    assert not [f for f in analyze_paths([events]).findings if f.code == "FT114"]
    path, i, ev = next((p, i, ev) for p, i, ev in canaries if ev["cell"] == 2 and ev["version"] == 1)
    lines = path.read_text().splitlines()
    ev["logprobs"][0] = math.nextafter(ev["logprobs"][0], -math.inf)  # one ulp: the engines still agree with cell 0
    lines[i] = json.dumps(ev)
    path.write_text("\n".join(lines) + "\n")
    (f,) = [f for f in analyze_paths([events]).findings if f.code == "FT114"]
    assert f.evidence["cell"] == 2 and f.evidence["reference_cell"] == 0 and f.evidence["version"] == 1
    assert "cell 2's trainer differs from cell 0's" in f.message and f.severity.value == "error"
