"""Speed and memory of ``ftkit compare-dumps`` on a generated pair of differing runs (issue 10, item 2).

Generates two run directories A and B whose dumps total ``--size`` MiB (default 1024 = 1 GiB,
half per side; ``--size 4096`` for the 4 GiB target): ``--rollouts`` rollouts, each with
``--writers`` micro-shard writers of activation-like tensors (float32 and bfloat16, 1-32 MiB)
and one replicated writer. B is written from the same tensors, except a ``--differ`` fraction
(default 1: every tensor) that is perturbed: ``--pattern sparse`` adds 1e-3 to every 997th
element, ``--pattern dense`` scales every element by 1 + noise of a few ulps. With the page cache warm,
it measures in the same run (best of ``--repeat``):

- ``cat``: ``cat`` of every file of both trees to /dev/null (the time to read them);
- ``library``: ``compare_paths(A, B)`` in a fresh process, imports excluded, for the tolerance
  mode and for ``--exact``;
- ``CLI``: ``ftkit compare-dumps A B [--exact] --format json`` as a subprocess (interpreter start
  and imports included: the wall time a user sees);
- ``naive`` (``--naive``): ``safetensors.torch.load_file`` of everything + ``torch.allclose``.

and prints each time over ``cat`` (targets: CLI at most 2x for 1 GiB, 1.5x for 4 GiB), exact
over tolerance (target at most 1), and the peak RSS of each process (``os.wait4``) over the
largest tensor pair. Usage::

    python bench/compare_dumps.py                           # 1 GiB, every tensor differs (sparse)
    python bench/compare_dumps.py --pattern dense           # every element differs
    python bench/compare_dumps.py --size 4096               # 4 GiB
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
from pathlib import Path

_WORKER = r"""
import json, sys, time
mode, a, b = sys.argv[1:4]
if mode in ("tolerance", "exact"):
    from ftkit.dumps.compare import CompareOptions, compare_paths
    t0, c0 = time.perf_counter(), time.process_time()
    r = compare_paths(a, b, CompareOptions(mode))
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({"seconds": dt, "cpu": cpu, "tensors": r.stats["tensors"], "differ": r.stats["differ"]}))
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
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", type=Path, default=None, help="where to generate (default: a temp dir, removed)")
    ap.add_argument("--naive", action="store_true", help="also time load-everything + torch.allclose")
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
        a, b = root / "a", root / "b"
        files = [str(p) for p in sorted(a.rglob("*")) + sorted(b.rglob("*")) if p.is_file()]
        total = sum(os.path.getsize(f) for f in files)
        cat = ["cat", *files]
        subprocess.run(cat, stdout=subprocess.DEVNULL, check=True)  # warm the page cache

        def best(fn):
            return min((fn() for _ in range(args.repeat)), key=lambda r: r[0])

        def cat_once():
            wall, _, _, cpu = run_child(cat, keep_stdout=False)
            return wall, 0, "", cpu

        def worker(mode):
            w = run_child([sys.executable, "-c", _WORKER, mode, str(a), str(b)])
            doc = json.loads(w[2])
            return doc["seconds"], w[1], w[2], doc["cpu"]

        def cli(*extra):
            argv = [sys.executable, "-m", "ftkit", "compare-dumps", str(a), str(b), *extra, "--format", "json"]
            return run_child(argv)

        t_cat, _, _, cpu_cat = best(cat_once)
        rows = {
            "library, tolerance": best(lambda: worker("tolerance")),
            "library, --exact": best(lambda: worker("exact")),
            "CLI, tolerance": best(lambda: cli()),
            "CLI, --exact": best(lambda: cli("--exact")),
        }
        if args.naive:
            rows["naive load + allclose"] = best(lambda: worker("naive"))
        doc = json.loads(rows["library, tolerance"][2])
        print(
            f"pair: {total / 2**30:.2f} GiB in {len(files)} files, {tensors} tensors per side, "
            f"{doc['differ']} differ ({args.pattern}); largest tensor {largest / 2**20:.0f} MiB; best of {args.repeat}"
        )
        print(f"  cat both trees        {t_cat:8.3f} s wall {cpu_cat:8.3f} s CPU")
        for k, (sec, rss, _, cpu) in rows.items():
            mem = f"   peak RSS {rss / 2**20:5.0f} MiB = {rss / (2 * largest):4.1f}x the largest pair"
            print(f"  {k:<21} {sec:8.3f} s wall {cpu:8.3f} s CPU  {sec / t_cat:5.2f}x cat{mem}")
        target = 2.0 if args.size <= 1024 else 1.5
        for mode in ("tolerance", "--exact"):
            wall, cpu = rows[f"CLI, {mode}"][0], rows[f"CLI, {mode}"][3]
            print(f"CLI {mode} / cat: wall {wall / t_cat:.2f} (target <= {target}), CPU {cpu / cpu_cat:.2f}")
        print(f"exact / tolerance (library): {rows['library, --exact'][0] / rows['library, tolerance'][0]:.2f} (<= 1)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
