"""Checkpoint publication and verification throughput (issue 8, section 7).

A TP=1/PP=1 state of ``--size`` MiB: parameters in float32 (and one float16 embedding) cut into
tensors of about ``--tensor-mib`` MiB (a real model has hundreds of tensors; ``--tensor-mib 0``:
one parameter tensor besides the embedding, the worst case for sharding), two float32 Adam moments
and a step per parameter, a few small RNG / counter tensors. Three payload groups, which the
publisher stores as shard files of at most ``--shard-mb`` MiB of tensor data. Measured in the
same run, interleaved (which of each pair goes first alternates), median of ``--repeat``:

- ``raw write``: the same bytes written to the same number of files (one file per shard), each
  fsynced, then the directory fsynced (what any durable writer must pay);
- ``publish``: ``preflight`` and ``Publisher.publish``: each shard written straight from the
  arrays in one fused pass (write, sha256, fingerprint, NaN/Inf scan per 1 MiB piece, fsync),
  the files in parallel; manifest, rename, journal, retention, ``latest``;
- ``raw read``: reading those files back sequentially in 16 MiB chunks (one thread);
- ``verify``: ``verify_path`` on the published checkpoint (every file read once: sha256,
  structure, fingerprints, NaN/Inf; the files in parallel).

Prints GB/s, ``publish / raw write`` and ``verify / raw read`` (target >= 0.7 each), the pause a
publication adds to training per GB (the driver publishes synchronously), the CPU seconds per GB
(all threads; barely moved by the load of a shared machine, the wall-clock figures are), the
load average before and after, and the bound the per-byte work sets: a file's sha256 is
sequential, so no verifier beats one core's sha256 of the largest FILE; and all files' work
(sha256 + fingerprint + scan, measured on one core) divided by the cores bounds it too.
``--cold`` drops each file from the page cache (``posix_fadvise DONTNEED``) before the reads,
so both reads come from the disk. Usage::

    python bench/checkpoint.py               # 512 MiB
    python bench/checkpoint.py --size 2048 --repeat 3 --cold
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


def make_state(size_mib: int, tensor_mib: int = 16) -> dict[str, dict[str, np.ndarray]]:
    """Parameters (float32 tensors of ~``tensor_mib`` MiB, one float16 embedding of ~1/12 of
    the parameters), two float32 Adam moments and a step for each, step counters, RNG bytes:
    numpy only, so the bench runs where torch is not installed."""
    rng = np.random.default_rng(0)
    per = (size_mib << 20) // 3  # bytes of float32 parameters: x3 with the two moments
    emb_rows = max(1, per // 12 // 4096 // 2)
    model = {"embedding.weight": rng.standard_normal((emb_rows, 4096), dtype=np.float32).astype(np.float16)}
    left = per - model["embedding.weight"].nbytes
    rows = max(1, (tensor_mib << 20) // 4 // 4096 if tensor_mib else left // 4 // 4096)
    layer = 0
    while left >= 4096 * 4:
        r = min(rows, left // 4 // 4096)
        model[f"decoder.layers.{layer}.weight"] = rng.standard_normal((r, 4096), dtype=np.float32)
        left -= r * 4096 * 4
        layer += 1
    optim: dict[str, np.ndarray] = {}
    for n, t in model.items():
        optim[f"{n}.exp_avg"] = rng.standard_normal(t.shape, dtype=np.float32)
        optim[f"{n}.exp_avg_sq"] = rng.random(t.shape, dtype=np.float32)
        optim[f"{n}.step"] = np.array(10.0, dtype=np.float32)
    extra = {"torch_cpu": np.zeros(5056, dtype=np.uint8), "counters": np.arange(4, dtype=np.int64)}
    return {"model.safetensors": model, "optimizer.safetensors": optim, "extra.safetensors": extra}


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


def one_core_rates(buf: np.ndarray) -> tuple[float, float]:
    """``(sha256, all per-byte work)`` in GB/s on one thread over ``buf`` (the largest file's
    bytes, in memory): sha256 fed as the checkpoint code feeds it, and the whole record
    (sha256 + fingerprint + NaN/Inf scan of float32 bytes) as ``digest.Recorder`` computes it."""
    import hashlib

    from ftkit.checkpoint.digest import Recorder, pieces, sha_update

    t0 = time.perf_counter()
    sha_update(hashlib.sha256(), buf)
    t1 = time.perf_counter()
    n = buf.size - buf.size % 4
    Recorder(n, True).tensor("x", "F32", (n // 4,), pieces(buf[:n]))
    t2 = time.perf_counter()
    return buf.size / (t1 - t0) / 1e9, n / (t2 - t1) / 1e9


def drop_cache(files: list[Path]) -> None:
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def main() -> None:
    from statistics import median

    from ftkit.checkpoint.guard import GuardVerdict
    from ftkit.checkpoint.preflight import agree, preflight
    from ftkit.checkpoint.publish import Payload, Publisher
    from ftkit.checkpoint.retention import RetentionPolicy
    from ftkit.checkpoint.scan import host_bytes
    from ftkit.checkpoint.shards import DEFAULT_SHARD_BYTES, split
    from ftkit.checkpoint.stfile import tensor_nbytes
    from ftkit.checkpoint.verify import verify_path

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=512, help="state size in MiB (default 512)")
    ap.add_argument("--tensor-mib", type=int, default=16, help="parameter tensor size in MiB (0: one big tensor)")
    ap.add_argument("--shard-mb", type=int, default=DEFAULT_SHARD_BYTES >> 20, help="shard size in MiB")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir under the cwd)")
    ap.add_argument("--cold", action="store_true", help="drop the files from the page cache before reading")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = ap.parse_args()
    state = make_state(args.size, args.tensor_mib)
    shard_bytes = args.shard_mb << 20
    payload = Payload(files=state, meta={"bench": True}, fingerprint_prefixes={"model.safetensors": "param/"})
    buffers: dict[str, np.ndarray] = {}  # the same bytes, one raw file per shard the publisher writes
    for group, tensors in state.items():
        for fname, part in split(
            group, tensors, {n: tensor_nbytes(t) for n, t in tensors.items()}, shard_bytes
        ).items():
            buffers[fname] = np.concatenate([host_bytes(part[n])[2] for n in sorted(part)] or [np.empty(0, np.uint8)])
    nbytes = sum(b.size for b in buffers.values())
    base = Path(tempfile.mkdtemp(prefix="ftkit-bench-ckpt-", dir=args.dir or Path.cwd()))
    pub = Publisher(
        base / "checkpoints", RetentionPolicy(keep_last=args.repeat + 1, keep_best=0), shard_bytes=shard_bytes
    )
    times: dict[str, list[float]] = {"raw_write": [], "publish": [], "raw_read": [], "verify": []}
    cpu: dict[str, list[float]] = {"publish": [], "verify": []}
    rates: list[tuple[float, float]] = []
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
            assert out.published and out.path is not None, out.reason
            phases.append(out.seconds)
            if not i % 2:
                times["raw_write"].append(raw_write(base / f"raw{i}", buffers))
            raw_files = sorted((base / f"raw{i}").iterdir())
            ck_files = sorted(out.path.iterdir())
            for which in ("raw_read", "verify") if i % 2 else ("verify", "raw_read"):  # alternate the readers
                if args.cold:
                    drop_cache(raw_files if which == "raw_read" else ck_files)
                t0, c0 = time.perf_counter(), time.process_time()
                if which == "raw_read":
                    raw_read(raw_files)
                else:
                    result = verify_path(out.path)
                    cpu["verify"].append(time.process_time() - c0)
                    assert not result.findings, result.findings
                times[which].append(time.perf_counter() - t0)
            rates.append(one_core_rates(max(buffers.values(), key=lambda b: b.size)))
            shutil.rmtree(base / f"raw{i}")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    sha_rate, work_rate = median(r[0] for r in rates), median(r[1] for r in rates)
    largest = max(b.size for b in buffers.values())
    cores = os.cpu_count() or 1
    mid = {k: median(v) for k, v in times.items()}
    gbps = {k: nbytes / v / 1e9 for k, v in mid.items()}
    raw_read_s = mid["raw_read"]
    # no verifier is faster than one core's sha256 of the largest file, or all sha256 work / cores
    sha_bound = raw_read_s / max(largest / sha_rate, nbytes / sha_rate / cores) * 1e9
    work_bound = raw_read_s / max(largest / work_rate, nbytes / work_rate / cores) * 1e9
    report = {
        "size_mib": round(nbytes / (1 << 20), 1),
        "files": len(buffers),
        "largest_file_mib": round(largest / (1 << 20), 1),
        "shard_mb": args.shard_mb,
        "tensor_mib": args.tensor_mib,
        "repeat": args.repeat,
        "cold": args.cold,
        "gb_per_s": {k: round(v, 3) for k, v in gbps.items()},
        "publish_over_raw_write": round(gbps["publish"] / gbps["raw_write"], 3),
        "verify_over_raw_read": round(gbps["verify"] / gbps["raw_read"], 3),
        "publish_pause_s_per_gb": round(mid["publish"] / (nbytes / 1e9), 3),
        "cpu_s_per_gb": {k: round(median(v) / (nbytes / 1e9), 3) for k, v in cpu.items()},
        "sha256_one_core_gb_per_s": round(sha_rate, 3),
        "work_one_core_gb_per_s": round(work_rate, 3),
        "verify_over_raw_read_sha256_bound": round(sha_bound, 3),
        "verify_over_raw_read_work_bound": round(work_bound, 3),
        "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "cpus": cores,
        "all_seconds": {k: [round(x, 4) for x in v] for k, v in times.items()},
        "publish_phases_s": phases[sorted(range(len(phases)), key=lambda i: times["publish"][i])[len(phases) // 2]],
    }
    if args.json:
        print(json.dumps(report))
        return
    print(
        f"state {report['size_mib']} MiB in {report['files']} files (shards of {args.shard_mb} MiB, largest "
        f"{report['largest_file_mib']} MiB), median of {args.repeat}{' (cold reads)' if args.cold else ''}, "
        f"{cores} CPUs, load average {report['load_average'][0]} -> {report['load_average'][1]}"
    )
    for k, v in gbps.items():
        print(f"  {k:10s} {v:7.3f} GB/s  ({mid[k]:.3f} s)")
    print(f"  publish / raw write = {report['publish_over_raw_write']:.3f}   (target >= 0.7)")
    print(f"  verify  / raw read  = {report['verify_over_raw_read']:.3f}   (target >= 0.7)")
    print(f"  publication pause   = {report['publish_pause_s_per_gb']:.3f} s per GB")
    print("  CPU per GB          = " + ", ".join(f"{k} {v:.3f} s" for k, v in report["cpu_s_per_gb"].items()))
    print(
        f"  one core            = sha256 {sha_rate:.3f} GB/s, sha256 + fingerprint + scan {work_rate:.3f} GB/s; "
        f"verify / raw read <= {sha_bound:.3f} for any verifier (sha256 of the largest file on one core, "
        f"all sha256 / {cores} cores), <= {work_bound:.3f} with all the per-byte work"
    )
    print("  publish phases (s)  = " + ", ".join(f"{k} {v:.3f}" for k, v in report["publish_phases_s"].items()))


if __name__ == "__main__":
    main()
