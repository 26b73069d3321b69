"""Speed and memory benchmark of ``ftkit analyze-events`` (issues 2, 10 and 13).

For each requested size it writes a realistic synthetic run log (``--generator synthetic``, the
default: ``ftkit.testing.synthetic``, through ftkit's own writer; ``--generator independent``:
``bench/independent_events.py``, ``json.dumps`` lines in another key order and spacing, so the
bench also measures inputs ftkit did not write) of cells x tp x pp rank files, faults with
reconfigure and heal, fingerprints of ``--tensors`` tensors split over the pipeline stages
(``--tensors 4`` gives many small events), merges it into
one file with ``write_merged_log`` (what ``ftkit train --merged-log`` writes) and measures, in
the same run, interleaved:

- ``plain``: a plain ``for line in f: json.loads(line)`` loop over the per-process files;
- ``floor``: the same loop with ``orjson.loads`` (decoding alone, the floor of any decoder);
- ``analyze``: ``ftkit analyze-events DIR --format json`` over the per-process files, as a
  subprocess (interpreter start and imports included), its wall / CPU time and peak RSS
  (``os.wait4`` rusage of that child);
- ``merged``: the same over the one merged file (read sequentially after a keys-only pass);
- ``shuffled`` (``--shuffled``): the same over the merged file's lines in random order (the
  bounded on-disk sort);
- ``w0``, ``w1``, ... (``--workers``): the per-process files again with ``FTKIT_ANALYZE_WORKERS``
  set to each count (0: one process; ``ftkit.analysis.parallel``), for the worker scaling: the
  speed-up over ``w0`` and its share per worker (parallel efficiency; where cores are fewer than
  workers + 1 the count simulates more cores and the efficiency falls).

It prints ``analyze / plain`` (issue 10's target: <= 0.5; earlier target <= 1.0), ``merged /
analyze`` and ``shuffled / analyze`` (issue 13's target for the merged file: <= 1.2), each in wall
and CPU time (the best of ``--repeat``, as other processes share the machine), and the peak RSS
(target <= 1 GiB at 10M events). Usage::

    python bench/analyze_events.py                       # 1M and 10M events (needs ~60 GB of disk)
    python bench/analyze_events.py --events 200000       # smaller
    python bench/analyze_events.py --events 1000000 --shuffled
    python bench/analyze_events.py --generator independent --events 150000 --tensors 4 --shuffled

The three shapes of issue 27 (``docs/analyze-events.md``, "Speed and memory")::

    python bench/analyze_events.py --generator independent --events 283000 --tensors 4          # many small events
    python bench/analyze_events.py --generator independent --events 283000 --cells 8 --tensors 20 # cells x tensors
    python bench/analyze_events.py --events 283000 --tensors 20 --shuffled --workers             # faulted, shuffled
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from ftkit.events.merge import write_merged_log
from ftkit.testing.synthetic import generate
from ftkit.testing.synthetic_spec import SyntheticSpec

sys.path.insert(0, str(Path(__file__).resolve().parent))
import independent_events  # noqa: E402 - the bench's own generator, next to this file


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


def write_log(root: Path, target: int, args: argparse.Namespace) -> None:
    """The run log of about ``target`` events under ``root/events`` (see ``--generator``)."""
    if args.generator == "synthetic":
        generate(root, spec_for(target, args))
        return
    flags = ["--events", str(target), "--cells", str(args.cells), "--tp", str(args.tp), "--pp", str(args.pp)]
    flags += ["--engines", str(args.engines), "--tensors", str(args.tensors), "--steps", str(args.steps_per_rollout)]
    independent_events.main([str(root), *flags, "--seed", str(args.seed)])


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


def floor_loop(files: list[Path]) -> tuple[float, float]:
    """Wall and CPU seconds of the same loop with ``orjson.loads`` (decoding alone)."""
    t0, c0 = time.perf_counter(), time.process_time()
    for path in files:
        with open(path, "rb") as f:
            for line in f:
                orjson.loads(line)
    return time.perf_counter() - t0, time.process_time() - c0


def analyze(path: Path, workers: int | None = None) -> tuple[float, float, int, int, dict]:
    """Wall seconds, CPU seconds, exit code, peak RSS bytes and the JSON document of one
    ``ftkit analyze-events`` subprocess (its rusage from ``os.wait4``, which includes its worker
    processes); ``workers``: ``FTKIT_ANALYZE_WORKERS`` for it (None: the analyzer's choice)."""
    out = tempfile.TemporaryFile()  # noqa: SIM115 - read back after the child exits
    env = dict(os.environ)
    if workers is not None:
        env["FTKIT_ANALYZE_WORKERS"] = str(workers)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ftkit", "analyze-events", str(path), "--format", "json"],
        stdout=out,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    out.seek(0)
    doc = json.loads(out.read() or b"{}")
    return wall, usage.ru_utime + usage.ru_stime, proc.returncode, usage.ru_maxrss * 1024, doc


def shuffle_lines(src: Path, dst: Path, seed: int) -> None:
    """``dst``: the lines of ``src`` in a random order (offsets shuffled in memory, lines copied)."""
    offsets, pos = [], 0
    with open(src, "rb") as fh:
        for line in fh:
            offsets.append((pos, len(line)))
            pos += len(line)
    random.Random(seed).shuffle(offsets)
    with open(src, "rb") as fh, open(dst, "wb", buffering=1 << 20) as out:
        for start, n in offsets:
            fh.seek(start)
            out.write(fh.read(n))


def _fingerprint(doc: dict) -> tuple:
    """What must not depend on the arrangement of the lines (see tests/events/logsplit.py)."""
    strip = lambda d: tuple(sorted((k, repr(v)) for k, v in d.items() if k not in ("file", "line")))  # noqa: E731
    return (
        doc.get("verdict"),
        sorted((f["code"], f["severity"], f["message"], strip(f["evidence"])) for f in doc.get("findings", [])),
        [(r["code"], r["checked"], r["findings"]) for r in doc.get("rules", [])],
        [strip(r) for r in doc.get("recovery", [])],
    )


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
    p.add_argument(
        "--generator",
        choices=("synthetic", "independent"),
        default="synthetic",
        help="synthetic: ftkit.testing.synthetic (ftkit's writer); independent: bench/independent_events.py",
    )
    p.add_argument("--dir", type=Path, default=None, help="where to write the logs (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the generated logs")
    p.add_argument("--repeat", type=int, default=2, help="measurements per size; the best of each is kept")
    p.add_argument("--shuffled", action="store_true", help="also measure the merged lines in random order")
    p.add_argument(
        "--workers",
        type=int,
        nargs="*",
        default=[0, 1, 2, 4],
        help="also analyse the per-process files with FTKIT_ANALYZE_WORKERS set to each (0: one process)",
    )
    p.add_argument("--existing", type=Path, default=None, help="measure a log kept by --keep (DIR/events) again")
    args = p.parse_args()
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for target in args.events:
        root = args.existing or Path(tempfile.mkdtemp(prefix=f"ftkit-bench-{target}-", dir=args.dir))
        try:
            t0 = time.perf_counter()
            events_dir = root / "events"
            if args.existing is None:
                write_log(root, target, args)
            merged = root / "merged.jsonl"
            if not merged.exists():
                write_merged_log(events_dir, merged)
            gen_s = time.perf_counter() - t0
            files = sorted(events_dir.glob("*.jsonl"))
            size = sum(f.stat().st_size for f in files)
            inputs = {"analyze": events_dir, "merged": merged}
            inputs.update({f"w{n}": events_dir for n in args.workers})
            if args.shuffled:
                inputs["shuffled"] = root / "shuffled.jsonl"
                if not inputs["shuffled"].exists():
                    shuffle_lines(merged, inputs["shuffled"], args.seed)
            print(
                f"[{target}] {size / 2**30:.2f} GiB in {len(files)} files, merged ({gen_s:.0f}s)",
                file=sys.stderr,
                flush=True,
            )
            wall: dict[str, list[float]] = {k: [] for k in ("plain", "floor", *inputs)}
            cpu: dict[str, list[float]] = {k: [] for k in ("plain", "floor", *inputs)}
            rss: dict[str, int] = dict.fromkeys(inputs, 0)
            docs: dict[str, dict] = {}
            for _ in range(args.repeat):  # interleaved; the best of each (noise on shared machines)
                w, c, lines = plain_loop(files)
                wall["plain"].append(w)
                cpu["plain"].append(c)
                w, c = floor_loop(files)
                wall["floor"].append(w)
                cpu["floor"].append(c)
                for name, path in inputs.items():
                    w, c, rc, peak, docs[name] = analyze(path, int(name[1:]) if name[0] == "w" else None)
                    wall[name].append(w)
                    cpu[name].append(c)
                    rss[name] = max(rss[name], peak)
                print(
                    f"[{target}] plain {wall['plain'][-1]:.1f}s, "
                    + ", ".join(f"{k} {wall[k][-1]:.1f}s (RSS {rss[k] / 2**20:.0f} MiB)" for k in inputs),
                    file=sys.stderr,
                    flush=True,
                )
            same = all(_fingerprint(docs[k]) == _fingerprint(docs["analyze"]) for k in inputs)
            best = {k: min(v) for k, v in wall.items()}
            best_cpu = {k: min(v) for k, v in cpu.items()}
            row = {
                "events": lines,
                "bytes": size,
                "files": len(files),
                **{f"{k}_s": round(v, 2) for k, v in best.items()},
                "ratio": round(best["analyze"] / best["plain"], 3),
                "cpu_ratio": round(best_cpu["analyze"] / best_cpu["plain"], 3),
                **{f"{k}_ratio": round(best[k] / best["plain"], 3) for k in ("floor", *inputs) if k != "analyze"},
                **{
                    f"{k}_cpu_ratio": round(best_cpu[k] / best_cpu["plain"], 3)
                    for k in ("floor", *inputs)
                    if k != "analyze"
                },
                "peak_rss_mib": {k: round(v / 2**20, 1) for k, v in rss.items()},
                "verdict": docs["analyze"].get("verdict"),
                "same_result": same,
            }
            for k in inputs:
                if k != "analyze":
                    row[f"{k}_vs_files"] = round(best[k] / best["analyze"], 3)
                    row[f"{k}_vs_files_cpu"] = round(best_cpu[k] / best_cpu["analyze"], 3)
            rows.append(row)
        finally:
            if not args.keep and args.existing is None:
                shutil.rmtree(root, ignore_errors=True)
    print(
        f"{'events':>10} {'GiB':>6} {'plain s':>8} {'files s':>8} {'ratio':>6} {'cpu':>6} "
        f"{'merged s':>9} {'vs files':>8} {'cpu':>6} {'RSS MiB (files/merged)':>22} verdict same"
    )
    for r in rows:
        print(
            f"{'':>10} vs the plain loop, wall / cpu: "
            + ", ".join(
                f"{k} {r[k + '_ratio']:.3f} / {r[k + '_cpu_ratio']:.3f}"
                for k in ("floor", "merged", "shuffled")
                if k + "_ratio" in r
            )
        )
        rss_text = f"{r['peak_rss_mib']['analyze']:.0f}/{r['peak_rss_mib']['merged']:.0f}"
        print(
            f"{r['events']:>10} {r['bytes'] / 2**30:>6.2f} {r['plain_s']:>8.1f} {r['analyze_s']:>8.1f} "
            f"{r['ratio']:>6.3f} {r['cpu_ratio']:>6.3f} {r['merged_s']:>9.1f} {r['merged_vs_files']:>8.3f} "
            f"{r['merged_vs_files_cpu']:>6.3f} {rss_text:>22} {r['verdict']} {r['same_result']}"
        )
        base = r.get("w0_s")
        for k in (f"w{n}" for n in args.workers):
            n = int(k[1:])
            speedup = (
                f", speed-up {base / r[k + '_s']:.2f}x ({base / r[k + '_s'] / max(n, 1):.0%} per worker)"
                if base
                else ""
            )
            print(
                f"{'':>10} workers {n}: {r[k + '_s']:.1f}s, vs the plain loop wall / cpu "
                f"{r[k + '_ratio']:.3f} / {r[k + '_cpu_ratio']:.3f}{speedup}, peak RSS {r['peak_rss_mib'][k]:.0f} MiB"
            )
        if "shuffled_s" in r:
            print(
                f"{'':>10} shuffled: {r['shuffled_s']:.1f}s, {r['shuffled_vs_files']:.3f}x the files "
                f"(cpu {r['shuffled_vs_files_cpu']:.3f}x), peak RSS {r['peak_rss_mib']['shuffled']:.0f} MiB"
            )
    print(json.dumps(rows))
    ok = all(r["verdict"] == "pass" and r["same_result"] and r["merged_vs_files"] <= 1.2 for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
