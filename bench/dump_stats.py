"""Speed of ``ftkit dump`` statistics against one numpy pass of the same statistics (issue 10, item 4).

On a model-like safetensors file (``--file PATH``, or one generated: ``--size`` MiB of float32
matrices shaped like a small transformer's, default 87 MiB like MiniLM), page cache warm,
measured in the same run (best of ``--repeat``):

- ``numpy``: per tensor, loaded zero-copy from a mapping of the file, ``min``, ``max``,
  ``mean``, ``std`` and ``isfinite().all()`` (the straightforward single-threaded way);
- ``ftkit (library)``: ``inspect_path(file, stats=True)``: the same statistics over finite
  values plus NaN/Inf counts, and the fingerprint of every tensor (imports excluded);
- ``ftkit dump --format json`` as a subprocess (interpreter start and imports included).

Prints ``speed ratio = numpy time / ftkit time`` per byte (target >= 0.7). Usage::

    python bench/dump_stats.py [--size 87] [--file model.safetensors] [--repeat 5]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np


def generate(path: Path, size_mib: int) -> None:
    from startup import write_st  # bench/startup.py: a numpy-only safetensors writer

    rng = np.random.default_rng(0)
    tensors, left, i = {}, size_mib << 20, 0
    while left >= 4 * 384:
        rows = min(1536, left // (4 * 384))
        tensors[f"encoder.layer.{i // 4}.w{i % 4}"] = rng.standard_normal((rows, 384), dtype=np.float32)
        left -= rows * 384 * 4
        i += 1
    write_st(path, tensors)


def numpy_pass(path: Path) -> None:
    from ftkit.tensors.arrays import MappedFile
    from ftkit.tensors.st import read_header

    header = read_header(path)
    mf = MappedFile(path)
    for info in header.tensors.values():
        a = mf.array(info)
        a.min(), a.max(), a.mean(), a.std(), np.isfinite(a).all()


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=87, help="generated file size in MiB (default 87)")
    ap.add_argument("--file", type=Path, default=None, help="use this safetensors file instead")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    from ftkit.dumps.inspect import inspect_path

    with tempfile.TemporaryDirectory(prefix="ftkit-stats-") as tmp:
        path = args.file or Path(tmp) / "model.safetensors"
        if args.file is None:
            generate(path, args.size)
        nbytes = path.stat().st_size
        path.read_bytes()  # warm the page cache
        t_np = best(lambda: numpy_pass(path), args.repeat)
        t_lib = best(lambda: inspect_path(path, stats=True), args.repeat)
        cli = [sys.executable, "-m", "ftkit", "dump", str(path), "--format", "json"]
        t_cli = best(lambda: subprocess.run(cli, stdout=subprocess.DEVNULL, check=True), args.repeat)
        print(f"file: {nbytes / 2**20:.0f} MiB, best of {args.repeat}")
        print(f"  numpy min/max/mean/std/isfinite   {t_np:7.3f} s  {nbytes / t_np / 1e9:6.2f} GB/s")
        print(f"  ftkit dump stats (library)        {t_lib:7.3f} s  {nbytes / t_lib / 1e9:6.2f} GB/s")
        print(f"  ftkit dump (CLI, start included)  {t_cli:7.3f} s")
        print(f"speed ratio numpy / library: {t_np / t_lib:.2f} (target >= 0.7)")
        print(f"speed ratio numpy / CLI:     {t_np / t_cli:.2f}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
