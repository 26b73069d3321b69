"""Speed and memory of ``ftkit compare-dumps`` on a generated pair of differing runs (issue 10, item 2).

Generates two run directories A and B whose dumps total ``--size`` MiB (default 1024 = 1 GiB,
half per side; ``--size 4096`` for the 4 GiB target): ``--rollouts`` rollouts, each with
``--writers`` micro-shard writers of activation-like tensors (float32 and bfloat16, 1-32 MiB)
and one replicated writer. B is written from the same tensors, except a ``--differ`` fraction
(default 1: every tensor) that is perturbed: ``--pattern sparse`` adds 1e-3 to every 997th
element, ``--pattern dense`` scales every element by 1 + noise of a few ulps. With the page cache warm,
it measures in the same run, rows interleaved, and reports the median (and best) of ``--repeat``:

- ``cat``: ``cat`` of every file of both trees to /dev/null (the time to read them);
- ``library``: ``compare_paths(A, B)`` in a fresh process, imports excluded, for the tolerance
  mode and for ``--exact``;
- ``CLI``: ``ftkit compare-dumps A B [--exact] --format json`` as a subprocess (interpreter start
  and imports included: the wall time a user sees);
- ``naive`` (``--naive``): ``safetensors.torch.load_file`` of everything + ``torch.allclose``;
- ``floor`` (``--floor``): the least a Python + numpy program can do for the same comparison, so
  the targets can be judged against what is reachable: both trees read with ``preadv`` into
  reused 256 KiB buffers, cut into chunks that two threads share (numpy releases the GIL), and
  per chunk only the fused tolerance test ``|a-b| > atol + rtol*|b|`` into ``out=`` buffers
  (bfloat16 widened by a bit shift), or for ``--exact`` a memcmp-speed ``bytes ==`` and an
  element count only where a chunk differs. No index, no fingerprint verification, no metrics,
  no report: ``floor`` times it like ``library`` (imports excluded), ``floor process`` like
  ``CLI`` (the whole process). It counts the failing elements, which must equal the library's.

and prints each time over ``cat`` (targets: CLI at most 2x for 1 GiB, 1.5x for 4 GiB), exact
over tolerance (target at most 1), and the peak RSS of each process (``os.wait4``) over the
largest tensor pair. Usage::

    python bench/compare_dumps.py                           # 1 GiB, every tensor differs (sparse)
    python bench/compare_dumps.py --pattern dense           # every element differs
    python bench/compare_dumps.py --size 4096               # 4 GiB
    python bench/compare_dumps.py --floor                   # and the numpy floor
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

_WORKER = r"""
import json, sys, time
mode, a, b = sys.argv[1:4]
if mode in ("tolerance", "exact"):
    from ftkit.dumps.compare import CompareOptions, compare_paths
    t0, c0 = time.perf_counter(), time.process_time()
    r = compare_paths(a, b, CompareOptions(mode))
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    count = "bits_differ" if mode == "exact" else "tol_fail"
    elements = sum(getattr(p.metrics, count) for p in r.pairs if p.metrics)
    doc = {"seconds": dt, "cpu": cpu, "tensors": r.stats["tensors"], "differ": r.stats["differ"], "elements": elements}
    print(json.dumps(doc))
else:
    import torch
    from pathlib import Path
    from safetensors.torch import load_file
    t0, c0 = time.perf_counter(), time.process_time()
    files = sorted(p.relative_to(a) for p in Path(a).rglob("*.safetensors"))
    sa = {f: load_file(Path(a) / f) for f in files}
    sb = {f: load_file(Path(b) / f) for f in files}
    differ = sum(1 for f in files for k in sa[f] if not torch.allclose(sa[f][k].float(), sb[f][k].float()))
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({"seconds": dt, "cpu": cpu, "tensors": sum(len(v) for v in sa.values()), "differ": differ}))
"""

_FLOOR = r"""
import json, os, struct, sys, threading, time
t_start = time.perf_counter()
import numpy as np
t_import = time.perf_counter()
mode, a, b = sys.argv[1:4]
CH = 1 << 18  # bytes per chunk and side: both sides' buffers stay in L2
RTOL, ATOL = 1e-5, 1e-8
SIZE = {"F32": 4, "BF16": 2}
jobs = []  # (file A, file B, offset, nbytes, dtype code): every tensor's bytes cut into chunks
for root, _, names in os.walk(a):
    for n in sorted(names):
        if not n.endswith(".safetensors"):
            continue
        fa = os.path.join(root, n)
        fb = os.path.join(b, os.path.relpath(fa, a))
        with open(fa, "rb") as fh:
            hl = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(hl))
        for k, v in header.items():
            if k == "__metadata__":
                continue
            s, e = v["data_offsets"]
            for o in range(s, e, CH):
                jobs.append((fa, fb, 8 + hl + o, min(CH, e - o), v["dtype"]))
def work(mine, out):
    ba, bb = bytearray(CH), bytearray(CH)
    f, g = np.empty(CH // 2, np.float32), np.empty(CH // 2, np.float32)
    h = np.empty(CH // 2, np.float32)
    m = np.empty(CH // 2, bool)
    bad = 0
    fds = {}
    def fd(p):
        if p not in fds:
            fds[p] = os.open(p, os.O_RDONLY)
        return fds[p]
    for fa, fb, off, n, code in mine:
        os.preadv(fd(fa), [memoryview(ba)[:n]], off)
        os.preadv(fd(fb), [memoryview(bb)[:n]], off)
        if mode == "exact":  # bytes equality at memcmp speed, then count differing elements
            if (ba == bb) if n == CH else (ba[:n] == bb[:n]):  # (a slice would be a copy)
                continue
            w = SIZE[code]
            ua = np.frombuffer(ba, np.uint32 if w == 4 else np.uint16, n // w)
            ub = np.frombuffer(bb, ua.dtype, n // w)
            np.not_equal(ua, ub, out=m[: n // w])
            bad += int(np.count_nonzero(m[: n // w]))
            continue
        if code == "F32":
            k = n // 4
            x, y = np.frombuffer(ba, np.float32, k), np.frombuffer(bb, np.float32, k)
        else:  # bfloat16 -> float32 by a 16-bit shift of the bits (exact)
            k = n // 2
            x, y = f[:k], g[:k]
            np.left_shift(np.frombuffer(ba, np.uint16, k), 16, out=x.view(np.uint32), dtype=np.uint32)
            np.left_shift(np.frombuffer(bb, np.uint16, k), 16, out=y.view(np.uint32), dtype=np.uint32)
        d, t, mm = h[:k], (g if code == "F32" else f)[:k], m[:k]
        np.subtract(x, y, out=d)
        np.abs(d, out=d)
        np.abs(y, out=t)  # (bf16: x is no longer needed, its buffer takes |b|)
        np.multiply(t, RTOL, out=t)
        np.add(t, ATOL, out=t)
        np.greater(d, t, out=mm)
        bad += int(np.count_nonzero(mm))
    for v in fds.values():
        os.close(v)
    out.append(bad)
t0, c0 = time.perf_counter(), time.process_time()
outs = []
threads = [threading.Thread(target=work, args=(jobs[i::2], outs)) for i in range(2)]
for th in threads:
    th.start()
for th in threads:
    th.join()
dt, cpu = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps({"seconds": dt, "cpu": cpu, "elements": sum(outs), "start": t_import - t_start}))
"""


def generate(
    root: Path, size_mib: int, rollouts: int, writers: int, differ: float, seed: int, pattern: str = "sparse"
) -> tuple[int, int]:
    """Write runs A and B under ``root``; returns (tensors per side, largest tensor bytes)."""
    import torch

    from ftkit.dumps.layout import microshard_writer, replicated_writer
    from ftkit.dumps.writer import DumpWriter
    from ftkit.tensors.sharding import Sharding

    g = torch.Generator().manual_seed(seed)
    per_side = (size_mib << 20) // 2
    per_writer = per_side // (rollouts * (writers + 1))
    sizes = [1 << 20, 4 << 20, 8 << 20, 32 << 20]
    count = largest = 0
    for side in ("a", "b"):
        (root / side / "events").mkdir(parents=True)
        (root / side / "run.json").write_text("{}")
    for r in range(rollouts):
        for w in range(writers + 1):
            name = replicated_writer(0, 0) if w == writers else microshard_writer(0, w, 0, 0)
            dws = {s: DumpWriter(root / s / "dumps", "actor", "fwd_bwd", r, name) for s in ("a", "b")}
            left, i = per_writer, 0
            while left >= (1 << 20):
                nbytes = min(sizes[i % len(sizes)], left) >> 20 << 20
                dtype = torch.bfloat16 if i % 3 == 2 else torch.float32
                numel = nbytes // (2 if dtype == torch.bfloat16 else 4)
                t = torch.randn(numel, generator=g).to(dtype).reshape(-1, 256)
                kind = "param" if w == writers else "output"
                tname = f"decoder.layers.{i}.mlp.linear_fc1.{kind}"
                ms = None if w == writers else w
                perturbed = t
                if torch.rand(1, generator=g).item() < differ:
                    perturbed = t.clone()
                    if pattern == "dense":
                        noise = torch.randn(t.shape, generator=g).to(t.dtype)
                        scale = 1e-2 if dtype == torch.bfloat16 else 1e-6  # a few ulps of the dtype
                        perturbed = (t.float() * (1 + scale * noise.float())).to(t.dtype)
                    else:
                        perturbed.view(-1)[::997] += 1e-3
                largest = max(largest, nbytes)
                dws["a"].add(tname, t, step=0, micro_shard=ms, sharding=Sharding.replicated(), copy=False)
                dws["b"].add(tname, perturbed, step=0, micro_shard=ms, sharding=Sharding.replicated(), copy=False)
                left -= nbytes
                i += 1
                count += 1
            for dw in dws.values():
                dw.write()
    return count, largest


def run_child(argv: list[str], keep_stdout: bool = True) -> tuple[float, int, str, float]:
    """Wall seconds, peak RSS bytes, stdout and CPU seconds (user + system) of one child."""
    out = tempfile.TemporaryFile() if keep_stdout else subprocess.DEVNULL  # noqa: SIM115 - read back below
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    text = ""
    if keep_stdout:
        out.seek(0)
        text = out.read().decode()
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        raise SystemExit(f"{argv[:4]} exited {code}")
    return wall, usage.ru_maxrss * 1024, text, usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1024, help="total dump size of both sides in MiB (default 1024)")
    ap.add_argument("--rollouts", type=int, default=4)
    ap.add_argument("--writers", type=int, default=4, help="micro-shard writers per rollout")
    ap.add_argument("--differ", type=float, default=1.0, help="fraction of tensors perturbed in B (default 1)")
    ap.add_argument("--pattern", choices=("sparse", "dense"), default="sparse")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each row; the median is reported (default 3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", type=Path, default=None, help="where to generate (default: a temp dir, removed)")
    ap.add_argument("--naive", action="store_true", help="also time load-everything + torch.allclose")
    ap.add_argument("--floor", action="store_true", help="also time the least numpy program (see the docstring)")
    ap.add_argument("--generate-into", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    spec = (args.size, args.rollouts, args.writers, args.differ, args.seed, args.pattern)
    if args.generate_into is not None:  # the child that generates (torch stays out of the parent)
        print(json.dumps(generate(args.generate_into, *spec)))
        return
    root = Path(tempfile.mkdtemp(prefix="ftkit-bench-", dir=args.dir))
    try:
        # Generated in a child process: a child's peak RSS (wait4) starts from its parent's RSS
        # at fork, so the parent that forks the measured commands must stay small.
        gen = [sys.executable, __file__, *sys.argv[1:], "--generate-into", str(root)]
        tensors, largest = json.loads(subprocess.run(gen, capture_output=True, text=True, check=True).stdout)
        measure(root, tensors, largest, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)


Row = tuple[float, int, str, float]  # wall seconds, peak RSS bytes, stdout, CPU seconds


def measure(root: Path, tensors: int, largest: int, args: argparse.Namespace) -> None:
    """Time every row ``args.repeat`` times, interleaved (load drifts affect every row alike),
    and print the medians and ratios."""
    a, b = root / "a", root / "b"
    files = [str(p) for p in sorted(a.rglob("*")) + sorted(b.rglob("*")) if p.is_file()]
    total = sum(os.path.getsize(f) for f in files)
    cat = ["cat", *files]
    subprocess.run(cat, stdout=subprocess.DEVNULL, check=True)  # warm the page cache

    def cat_once() -> Row:
        wall, _, _, cpu = run_child(cat, keep_stdout=False)
        return wall, 0, "", cpu

    def child(code: str, mode: str) -> Row:  # time inside the child, imports excluded
        w = run_child([sys.executable, "-c", code, mode, str(a), str(b)])
        doc = json.loads(w[2])
        return doc["seconds"], w[1], w[2], doc["cpu"]

    def process(code: str, mode: str) -> Row:  # the child's whole wall time, start-up included
        return run_child([sys.executable, "-c", code, mode, str(a), str(b)])

    def cli(*extra: str) -> Row:
        return run_child([sys.executable, "-m", "ftkit", "compare-dumps", str(a), str(b), *extra, "--format", "json"])

    jobs: dict[str, Callable[[], Row]] = {
        "cat both trees": cat_once,
        "library, tolerance": lambda: child(_WORKER, "tolerance"),
        "library, --exact": lambda: child(_WORKER, "exact"),
        "CLI, tolerance": cli,
        "CLI, --exact": lambda: cli("--exact"),
    }
    if args.floor:
        jobs |= {
            "floor, tolerance": lambda: child(_FLOOR, "tolerance"),
            "floor, --exact": lambda: child(_FLOOR, "exact"),
            "floor process, tol.": lambda: process(_FLOOR, "tolerance"),
            "floor process, exact": lambda: process(_FLOOR, "exact"),
        }
    if args.naive:
        jobs["naive load + allclose"] = lambda: child(_WORKER, "naive")
    runs: dict[str, list[Row]] = {k: [] for k in jobs}
    for _ in range(args.repeat):
        for k, fn in jobs.items():
            runs[k].append(fn())
    rows = {k: sorted(v, key=lambda r: r[0])[len(v) // 2] for k, v in runs.items()}  # the median run
    best = {k: min(r[0] for r in v) for k, v in runs.items()}
    t_cat, cpu_cat = rows["cat both trees"][0], rows["cat both trees"][3]
    doc = json.loads(rows["library, tolerance"][2])
    print(
        f"pair: {total / 2**30:.2f} GiB in {len(files)} files, {tensors} tensors per side, "
        f"{doc['differ']} differ ({args.pattern}); largest tensor {largest / 2**20:.0f} MiB; "
        f"median (best) of {args.repeat}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    )
    for k, (sec, rss, _, cpu) in rows.items():
        mem = f"   peak RSS {rss / 2**20:5.0f} MiB = {rss / (2 * largest):4.1f}x the largest pair" if rss else ""
        print(f"  {k:<22} {sec:7.3f} ({best[k]:6.3f}) s wall {cpu:7.3f} s CPU  {sec / t_cat:5.2f}x cat{mem}")
    target = 2.0 if args.size <= 1024 else 1.5
    for mode in ("tolerance", "--exact"):
        wall, cpu = rows[f"CLI, {mode}"][0], rows[f"CLI, {mode}"][3]
        print(f"CLI {mode} / cat: wall {wall / t_cat:.2f} (target <= {target}), CPU {cpu / cpu_cat:.2f}")
    print(f"exact / tolerance (library): {rows['library, --exact'][0] / rows['library, tolerance'][0]:.2f} (<= 1)")
    if args.floor:
        for mode, short in (("tolerance", "tol."), ("--exact", "exact")):
            lib, flo = rows[f"library, {mode}"], rows[f"floor, {mode}"]
            counts = (json.loads(lib[2])["elements"], json.loads(flo[2])["elements"])
            same = "same" if counts[0] == counts[1] else "DIFFERENT"
            print(
                f"{mode}: library / floor {lib[0] / flo[0]:.2f} wall, {lib[3] / flo[3]:.2f} CPU; "
                f"floor process / cat {rows[f'floor process, {short}'][0] / t_cat:.2f}; "
                f"failing elements library {counts[0]}, floor {counts[1]} ({same})"
            )


if __name__ == "__main__":
    main()
