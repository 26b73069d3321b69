"""Checkpoint publication and verification throughput (issue 8, section 7).

A TP=1/PP=1 state of ``--size`` MiB (model in float32 and float16, Adam moments in float32,
a few small RNG / counter tensors; three files) measured in the same run, interleaved (which
writer goes first alternates), best of ``--repeat``:

- ``raw write``: the same bytes written to the same number of files, each fsynced, then the
  directory fsynced (what any durable writer must pay);
- ``publish``: ``preflight`` and ``Publisher.publish``: serialise straight from the arrays, each
  file fsynced once, while the sha256 of every file and the fingerprint + NaN/Inf scan of every
  tensor run on every core; manifest, rename, journal, retention, ``latest``;
- ``raw read``: reading those files back in 16 MiB chunks;
- ``verify``: ``verify_path`` on the published checkpoint (sha256, structure, fingerprints,
  NaN/Inf, every file; each file mapped once, the same jobs on every core).

Prints GB/s, ``publish / raw write`` and ``verify / raw read`` (target >= 0.7 each), the
pause a publication adds to training per GB (the driver publishes synchronously: training
waits for the whole ``publish``), the CPU seconds per GB each one costs (all threads; this
figure barely moves with the load of a shared machine, the wall-clock ones do), the load
average before and after, and the bound sha256 sets: a file's sha256 is sequential, so no
verifier can beat one core's sha256 of the largest file. ``--cold`` drops each file from the page cache
(``posix_fadvise DONTNEED``) before the reads, so both reads come from the disk. Usage::

    python bench/checkpoint.py               # 512 MiB
    python bench/checkpoint.py --size 128 --repeat 5 --cold
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np


def make_state(size_mib: int) -> dict[str, dict[str, np.ndarray]]:
    """Model (float32 and float16 halves), two float32 Adam moments per parameter, step
    counters, RNG bytes: numpy only, so the bench runs where torch is not installed."""
    rng = np.random.default_rng(0)
    per = (size_mib << 20) // 22  # model f32 + f16 (6 bytes) + two f32 moments for each (16 bytes)
    rows = max(1, per // 4096)
    model = {
        "decoder.weight": rng.standard_normal((rows, 4096), dtype=np.float32),
        "embedding.weight": rng.standard_normal((rows, 4096), dtype=np.float32).astype(np.float16),
    }
    optim: dict[str, np.ndarray] = {}
    for n, t in model.items():
        optim[f"{n}.exp_avg"] = rng.standard_normal(t.shape, dtype=np.float32)
        optim[f"{n}.exp_avg_sq"] = rng.random(t.shape, dtype=np.float32)
        optim[f"{n}.step"] = np.array(10.0, dtype=np.float32)
    extra = {"torch_cpu": np.zeros(5056, dtype=np.uint8), "counters": np.arange(4, dtype=np.int64)}
    return {"model.safetensors": model, "optimizer.safetensors": optim, "rng.safetensors": extra}


def raw_write(root: Path, buffers: dict[str, np.ndarray]) -> float:
    root.mkdir()
    t0 = time.perf_counter()
    for name, buf in buffers.items():
        with open(root / name, "wb") as fh:
            fh.write(memoryview(buf))
            fh.flush()
            os.fsync(fh.fileno())
    fd = os.open(root, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    return time.perf_counter() - t0


def raw_read(files: list[Path]) -> float:
    t0 = time.perf_counter()
    buf = bytearray(16 << 20)
    for p in files:
        with open(p, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass
    return time.perf_counter() - t0


def sha256_one_core(buf: np.ndarray) -> float:
    """Seconds for one sha256 over ``buf`` on one thread (the floor of any pass that must hash
    a file: a file's sha256 is sequential, so its largest file bounds a checkpoint's)."""
    import hashlib

    t0 = time.perf_counter()
    hashlib.sha256(buf).digest()
    return time.perf_counter() - t0


def drop_cache(files: list[Path]) -> None:
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def main() -> None:
    from ftkit.checkpoint.guard import GuardVerdict
    from ftkit.checkpoint.preflight import agree, preflight
    from ftkit.checkpoint.publish import Payload, Publisher
    from ftkit.checkpoint.retention import RetentionPolicy
    from ftkit.checkpoint.scan import host_bytes
    from ftkit.checkpoint.verify import verify_path

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=512, help="state size in MiB (default 512)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir under the cwd)")
    ap.add_argument("--cold", action="store_true", help="drop the files from the page cache before reading")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = ap.parse_args()
    state = make_state(args.size)
    payload = Payload(files=state, meta={"bench": True}, fingerprint_prefixes={"model.safetensors": "param/"})
    buffers = {f: np.concatenate([host_bytes(t)[2] for t in ts.values()]) for f, ts in state.items()}
    nbytes = sum(b.size for b in buffers.values())
    base = Path(tempfile.mkdtemp(prefix="ftkit-bench-ckpt-", dir=args.dir or Path.cwd()))
    pub = Publisher(base / "checkpoints", RetentionPolicy(keep_last=args.repeat + 1, keep_best=0))
    times: dict[str, list[float]] = {"raw_write": [], "publish": [], "raw_read": [], "verify": [], "sha256": []}
    cpu: dict[str, list[float]] = {"publish": [], "verify": []}
    load_before = os.getloadavg()[0]
    phases: list[dict[str, float]] = []
    try:
        for i in range(args.repeat):
            step = 4 * i + 3
            if i % 2:  # alternate which of the two writers goes first
                times["raw_write"].append(raw_write(base / f"raw{i}", buffers))
            gv = GuardVerdict(step - 3, step, False)
            t0, c0 = time.perf_counter(), time.process_time()
            agreed = agree([preflight(pub.dir, step, payload.nbytes, gv, "bench")])
            out = pub.publish(step, payload, gv, agreed, metric=0.0)
            times["publish"].append(time.perf_counter() - t0)
            cpu["publish"].append(time.process_time() - c0)
            assert out.published, out.reason
            phases.append(out.seconds)
            if not i % 2:
                times["raw_write"].append(raw_write(base / f"raw{i}", buffers))
            raw_files = sorted((base / f"raw{i}").iterdir())
            ck_files = sorted(out.path.iterdir())
            if args.cold:
                drop_cache(raw_files)
            times["raw_read"].append(raw_read(raw_files))
            if args.cold:
                drop_cache(ck_files)
            t0, c0 = time.perf_counter(), time.process_time()
            result = verify_path(out.path)
            times["verify"].append(time.perf_counter() - t0)
            cpu["verify"].append(time.process_time() - c0)
            assert not result.findings, result.findings
            times["sha256"].append(sha256_one_core(max(buffers.values(), key=lambda b: b.size)))
            shutil.rmtree(base / f"raw{i}")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    sha_best = min(times.pop("sha256"))
    largest = max(b.size for b in buffers.values())
    best = {k: min(v) for k, v in times.items()}
    gbps = {k: nbytes / v / 1e9 for k, v in best.items()}
    report = {
        "size_mib": round(nbytes / (1 << 20), 1),
        "repeat": args.repeat,
        "cold": args.cold,
        "gb_per_s": {k: round(v, 3) for k, v in gbps.items()},
        "publish_over_raw_write": round(gbps["publish"] / gbps["raw_write"], 3),
        "verify_over_raw_read": round(gbps["verify"] / gbps["raw_read"], 3),
        "publish_pause_s_per_gb": round(best["publish"] / (nbytes / 1e9), 3),
        "cpu_s_per_gb": {k: round(min(v) / (nbytes / 1e9), 3) for k, v in cpu.items()},
        "sha256_one_core_gb_per_s": round(largest / sha_best / 1e9, 3),
        "largest_file_share": round(largest / nbytes, 3),
        "verify_over_raw_read_bound": round(best["raw_read"] / sha_best, 3),
        "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "cpus": os.cpu_count(),
        "all_seconds": {k: [round(x, 4) for x in v] for k, v in times.items()},
        "publish_phases_s": phases[min(range(len(phases)), key=lambda i: times["publish"][i])],
    }
    if args.json:
        print(json.dumps(report))
        return
    print(
        f"state {report['size_mib']} MiB, best of {args.repeat}{' (cold reads)' if args.cold else ''}, "
        f"{report['cpus']} CPUs, load average {report['load_average'][0]} -> {report['load_average'][1]}"
    )
    for k, v in gbps.items():
        print(f"  {k:10s} {v:7.3f} GB/s  ({best[k]:.3f} s)")
    print(f"  publish / raw write = {report['publish_over_raw_write']:.3f}   (target >= 0.7)")
    print(f"  verify  / raw read  = {report['verify_over_raw_read']:.3f}   (target >= 0.7)")
    print(f"  publication pause   = {report['publish_pause_s_per_gb']:.3f} s per GB")
    print("  CPU per GB          = " + ", ".join(f"{k} {v:.3f} s" for k, v in report["cpu_s_per_gb"].items()))
    print(
        f"  sha256, one core    = {report['sha256_one_core_gb_per_s']:.3f} GB/s; the largest file is "
        f"{report['largest_file_share']:.0%} of the bytes, so verify / raw read <= "
        f"{report['verify_over_raw_read_bound']:.3f} here whatever the cores"
    )
    print("  publish phases (s)  = " + ", ".join(f"{k} {v:.3f}" for k, v in report["publish_phases_s"].items()))


if __name__ == "__main__":
    main()
