"""Speed and memory benchmark of ``ftkit compare-runs`` (issue 39, item 6).

Writes two synthetic run logs of about ``--events`` events each with ``ftkit.testing.synthetic``
(the generator of ``bench/analyze_events.py``: cells x tp x pp rank files, fingerprints of
``--tensors`` tensors, faults with reconfigure and heal): A with ``--cells`` cells and faults, B
with half the cells and none, the same seed, so they compare equal over every step (the costliest
case: every item is matched and compared); with ``--merged`` each log is one merged file (as
``ftkit.events.merge`` writes it: demultiplexed on reading). Then measures, interleaved, in the
same run:

- ``analyze``: ``ftkit analyze-events A --format json`` (the larger log) as a subprocess;
- ``compare``: ``ftkit compare-runs A B --format json`` as a subprocess;

wall and CPU time (best of ``--repeat``, as other processes share the machine) and the peak RSS,
and prints ``compare / analyze`` (issue 39's target: <= 2.0). Usage::

    python bench/compare_runs.py                         # 283k events per log
    python bench/compare_runs.py --events 100000 --repeat 1
    python bench/compare_runs.py --merged                # one merged log file per run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from ftkit.events.merge import write_merged_log
from ftkit.testing.synthetic import generate
from ftkit.testing.synthetic_spec import SyntheticSpec


def spec(events: int, cells: int, tensors: int, faults: bool) -> SyntheticSpec:
    steps_per_rollout = 4
    per_step = 3 * cells + 1  # outcome, fingerprint, witness counts per rank; the driver's metric
    rollouts = max(1, math.ceil(events / (steps_per_rollout * per_step + 4)))
    return SyntheticSpec(
        cells=cells,
        engines=2,
        rollouts=rollouts,
        steps_per_rollout=steps_per_rollout,
        samples_per_rollout=steps_per_rollout * 16,
        tensors=tensors,
        faults=max(1, rollouts // 50) if faults else 0,
        run="bench",
    )


def child(*args: str) -> tuple[float, float, int, int, dict]:
    """Wall seconds, CPU seconds, exit code, peak RSS bytes, JSON document of one ftkit subprocess."""
    out = tempfile.TemporaryFile()  # noqa: SIM115 - read back after the child exits
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ftkit", *args, "--format", "json"], stdout=out, stderr=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    out.seek(0)
    doc = json.loads(out.read() or b"{}")
    return wall, usage.ru_utime + usage.ru_stime, os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024, doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=283_000, help="events per log (about)")
    p.add_argument("--cells", type=int, default=4, help="cells of A (B has half)")
    p.add_argument("--tensors", type=int, default=20)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--merged", action="store_true", help="each run's log as one merged file")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ftkit-bench-cr-") as tmp:
        a, b = Path(tmp) / "a", Path(tmp) / "b"
        sa = spec(args.events, args.cells, args.tensors, True)
        sb = replace(sa, cells=max(1, args.cells // 2), faults=0)  # the same steps: B is the larger log's twin
        na, nb = generate(a, sa).events, generate(b, sb).events
        if args.merged:
            for run in (a, b):
                write_merged_log(run / "events", run.with_suffix(".jsonl"))
            a, b = a.with_suffix(".jsonl"), b.with_suffix(".jsonl")
        big = a if na >= nb else b
        print(f"A: {na} events ({args.cells} cells, faults), B: {nb} events ({max(1, args.cells // 2)} cells)")
        best: dict[str, tuple[float, float, int]] = {}
        for _ in range(args.repeat):
            for name, cmd in (("analyze", ("analyze-events", str(big))), ("compare", ("compare-runs", str(a), str(b)))):
                wall, cpu, code, rss, doc = child(*cmd)
                expected = 0 if name == "compare" else code
                if code != expected:
                    print(f"{name} exited {code}", file=sys.stderr)
                    return 1
                if name == "compare" and doc.get("steps", {}).get("differ"):
                    print("compare found differing steps: the bench logs must compare equal", file=sys.stderr)
                    return 1
                old = best.get(name)
                best[name] = (
                    min(wall, old[0]) if old else wall,
                    min(cpu, old[1]) if old else cpu,
                    max(rss, old[2] if old else 0),
                )
        for name, (wall, cpu, rss) in best.items():
            print(f"{name:8s} wall {wall:7.2f}s  cpu {cpu:7.2f}s  peak RSS {rss / 2**20:7.0f} MiB")
        ratio_wall = best["compare"][0] / best["analyze"][0]
        ratio_cpu = best["compare"][1] / best["analyze"][1]
        print(f"compare / analyze: wall {ratio_wall:.2f}, cpu {ratio_cpu:.2f} (target <= 2.0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
