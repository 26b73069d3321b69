"""Speed and memory benchmark of ``ftkit analyze-events`` (issue 2, part 4).

For each requested size it writes a realistic synthetic run log (``ftkit.testing.synthetic``:
cells x tp x pp rank files, faults with reconfigure and heal, fingerprints of ``--tensors``
tensors split over the pipeline stages), then measures, in the same run:

- ``plain``: a plain ``for line in f: json.loads(line)`` loop over the same files;
- ``analyze``: ``ftkit analyze-events DIR --format json`` as a subprocess (interpreter start and
  imports included), its wall time and peak RSS (``os.wait4`` rusage of that child);

and prints ``ratio = analyze / plain`` wall time (target <= 1.0; the best of ``--repeat``
interleaved measurements, as other processes share the machine), the same ratio in CPU time,
and the peak RSS (target <= 1 GiB at 10M events). Usage::

    python bench/analyze_events.py                       # 1M and 10M events (needs ~40 GB of disk)
    python bench/analyze_events.py --events 200000       # smaller
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ftkit.testing.synthetic import SyntheticSpec, generate


def spec_for(events: int, args: argparse.Namespace) -> SyntheticSpec:
    ranks = args.tp * args.pp
    per_step = 2 * args.cells * ranks + args.cells * ranks + 1  # outcome, fingerprint, witness counts; metric
    per_rollout = args.steps_per_rollout * per_step + 2 + args.engines
    rollouts = max(1, math.ceil(events / per_rollout))
    return SyntheticSpec(
        cells=args.cells,
        tp=args.tp,
        pp=args.pp,
        engines=args.engines,
        rollouts=rollouts,
        steps_per_rollout=args.steps_per_rollout,
        samples_per_rollout=args.steps_per_rollout * 16,
        tensors=args.tensors,
        faults=max(1, rollouts // 50),
        seed=args.seed,
        run="bench",
    )


def plain_loop(files: list[Path]) -> tuple[float, float, int]:
    """Wall and CPU seconds of a plain json.loads loop over ``files``, and the line count."""
    t0, c0 = time.perf_counter(), time.process_time()
    n = 0
    for path in files:
        with open(path, "rb") as f:
            for line in f:
                json.loads(line)
                n += 1
    return time.perf_counter() - t0, time.process_time() - c0, n


def analyze(events_dir: Path) -> tuple[float, float, int, int, dict]:
    """Wall seconds, CPU seconds, exit code, peak RSS bytes and the JSON document of one
    ``ftkit analyze-events`` subprocess (its own rusage, from ``os.wait4``)."""
    out = tempfile.TemporaryFile()  # noqa: SIM115 - read back after the child exits
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ftkit", "analyze-events", str(events_dir), "--format", "json"],
        stdout=out,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    out.seek(0)
    doc = json.loads(out.read() or b"{}")
    return wall, usage.ru_utime + usage.ru_stime, proc.returncode, usage.ru_maxrss * 1024, doc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, nargs="+", default=[1_000_000, 10_000_000])
    p.add_argument("--cells", type=int, default=4)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--tensors", type=int, default=100)
    p.add_argument("--steps-per-rollout", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dir", type=Path, default=None, help="where to write the logs (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the generated logs")
    p.add_argument("--repeat", type=int, default=2, help="measurements per size; the best of each is kept")
    args = p.parse_args()
    rows = []
    for target in args.events:
        root = Path(tempfile.mkdtemp(prefix=f"ftkit-bench-{target}-", dir=args.dir))
        try:
            t0 = time.perf_counter()
            run = generate(root, spec_for(target, args))
            gen_s = time.perf_counter() - t0
            files = sorted(run.events_dir.glob("*.jsonl"))
            size = sum(f.stat().st_size for f in files)
            print(
                f"[{target}] generated {run.events} events, {size / 2**30:.2f} GiB in {len(files)} files "
                f"({gen_s:.0f}s)",
                file=sys.stderr,
                flush=True,
            )
            plain, cpu_plain, ana, cpu_ana, rss = [], [], [], [], 0
            for _ in range(args.repeat):  # interleaved; the best of each (noise on shared machines)
                wall, cpu, lines = plain_loop(files)
                plain.append(wall)
                cpu_plain.append(cpu)
                wall, cpu, rc, peak, doc = analyze(run.events_dir)
                ana.append(wall)
                cpu_ana.append(cpu)
                rss = max(rss, peak)
                print(
                    f"[{target}] plain json loop {plain[-1]:.1f}s, analyze {wall:.1f}s (exit {rc}, verdict "
                    f"{doc.get('verdict')}), peak RSS {peak / 2**20:.0f} MiB",
                    file=sys.stderr,
                    flush=True,
                )
            rows.append(
                {
                    "events": lines,
                    "bytes": size,
                    "files": len(files),
                    "plain_s": round(min(plain), 2),
                    "analyze_s": round(min(ana), 2),
                    "ratio": round(min(ana) / min(plain), 3),
                    "cpu_ratio": round(min(cpu_ana) / min(cpu_plain), 3),
                    "peak_rss_mib": round(rss / 2**20, 1),
                    "exit": rc,
                    "verdict": doc.get("verdict"),
                }
            )
        finally:
            if not args.keep:
                shutil.rmtree(root, ignore_errors=True)
    print(
        f"{'events':>10} {'GiB':>6} {'plain s':>8} {'analyze s':>10} {'ratio':>6} {'cpu ratio':>9} "
        f"{'peak RSS MiB':>13} verdict"
    )
    for r in rows:
        print(
            f"{r['events']:>10} {r['bytes'] / 2**30:>6.2f} {r['plain_s']:>8.1f} {r['analyze_s']:>10.1f} "
            f"{r['ratio']:>6.3f} {r['cpu_ratio']:>9.3f} {r['peak_rss_mib']:>13.0f} {r['verdict']}"
        )
    print(json.dumps(rows))
    ok = all(r["ratio"] <= 1.0 and r["verdict"] == "pass" for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
