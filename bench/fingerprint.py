"""Throughput of ``ftkit.tensors.fingerprint`` (issue 3, part 1).

On one float32 tensor of ``--size`` MiB (default 1024 = 1 GiB), measured in the same run
(best of ``--repeat``):

- ``memcpy``: ``numpy.copyto`` of the same bytes into a preallocated array;
- ``fingerprint``: ``fingerprint(t)`` of the contiguous tensor;
- ``fingerprint (strided)``: of its transpose-like strided view (pieces made contiguous);
- ``sha256``: ``hashlib.sha256`` over the same bytes (what others use).

Prints GB/s for each and ``ratio = fingerprint / memcpy`` (target >= 0.8). Usage::

    python bench/fingerprint.py              # 1 GiB
    python bench/fingerprint.py --size 128   # smaller
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Callable

import numpy as np
import torch

from ftkit.tensors.fingerprint import fingerprint


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1024, help="tensor size in MiB (default 1024)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = ap.parse_args()
    nbytes = args.size << 20
    t = torch.randn(nbytes // 4, generator=torch.Generator().manual_seed(0))
    src = t.numpy()
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in before timing
    strided = t.reshape(-1, 1024)[:, ::2]  # half the bytes, every other column
    results = {
        "memcpy": best(lambda: np.copyto(dst, src), args.repeat),
        "fingerprint": best(lambda: fingerprint(t), args.repeat),
        "fingerprint_strided": best(lambda: fingerprint(strided), args.repeat),
        "sha256": best(lambda: hashlib.sha256(src).digest(), args.repeat),
    }
    gbps = {k: (nbytes / 2 if k == "fingerprint_strided" else nbytes) / v / 1e9 for k, v in results.items()}
    report = {
        "size_mib": args.size,
        "threads": torch.get_num_threads(),
        "seconds": results,
        "gb_per_s": gbps,
        "ratio_vs_memcpy": gbps["fingerprint"] / gbps["memcpy"],
        "speedup_vs_sha256": gbps["fingerprint"] / gbps["sha256"],
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"tensor: {args.size} MiB float32, torch threads {report['threads']}")
    for k in results:
        print(f"  {k:<20} {results[k] * 1e3:9.1f} ms  {gbps[k]:7.2f} GB/s")
    print(f"fingerprint / memcpy throughput: {report['ratio_vs_memcpy']:.2f} (target >= 0.8)")
    print(f"fingerprint / sha256 throughput: {report['speedup_vs_sha256']:.1f}x")


if __name__ == "__main__":
    main()
