"""Throughput of ``ftkit.tensors.fingerprint`` (issue 3, part 1).

On one float32 tensor of ``--size`` MiB (default 1024 = 1 GiB), measured in the same run
(best of ``--repeat``):

- ``memcpy``: ``numpy.copyto`` of the same bytes into a preallocated array;
- ``fingerprint``: ``fingerprint(t)`` of the contiguous tensor (scheme ``ftkit-fp2``, what logs
  and checkpoints get); ``fingerprint fp1``: the same in ``ftkit-fp1`` (one xxh3-128 stream, the
  scheme before it and still the dumps'); ``fp2 / fp1`` is their throughput ratio (the issue:
  no slower than before on CPU);
- ``state`` / ``state fp1``: ``fingerprints`` of a model-like state of ``--state-tensors``
  tensors of the same total size (a rank's per-step state fingerprint), in each scheme;
- ``fingerprint (strided)``: of its transpose-like strided view (pieces made contiguous);
- ``sha256``: ``hashlib.sha256`` over the same bytes (what others use);
- ``file, 1 thread`` / ``file, all cores``: the same bytes as a safetensors file of ``--tensors``
  tensors, fingerprinted from its mapping the way ``compare-dumps`` and ``dump`` do, one tensor
  after the other and then on the shared pool (``ftkit.dumps.loader.fingerprint_all``).

Prints GB/s for each, ``ratio = fingerprint / memcpy`` (target >= 0.8) and the file ratio
``all cores / one core's memcpy`` (issue 10: target >= 1.5 on 2 cores).

``--device cuda`` measures the tensor in GPU memory instead: ``device copy`` (``clone``, the
memory-bandwidth baseline), ``fingerprint`` (``ftkit-fp2``, hashed on the GPU), ``fingerprint
fp1`` (streamed to the host) and ``state``; target ``fingerprint`` >= 200 GB/s on an H200 (issue
36). Usage::

    python bench/fingerprint.py              # 1 GiB
    python bench/fingerprint.py --size 128   # smaller
    python bench/fingerprint.py --device cuda --size 4096
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ftkit.tensors.fingerprint import fingerprint, fingerprints
from ftkit.tensors.parallel import workers


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def file_fingerprints(t: torch.Tensor, n: int, repeat: int) -> dict[str, float]:
    """Seconds to fingerprint ``t``'s bytes stored as a file of ``n`` tensors: one thread, all."""
    from ftkit.dumps.loader import TensorLoader, fingerprint_all, fingerprint_verified
    from ftkit.dumps.sources import TensorRef
    from ftkit.tensors.st import read_header, write_safetensors_atomic

    with tempfile.TemporaryDirectory(prefix="ftkit-fp-") as tmp:
        path = Path(tmp) / "f.safetensors"
        write_safetensors_atomic(path, {f"t{i}": piece for i, piece in enumerate(t.chunk(n))})
        refs = [TensorRef(path, info) for info in read_header(path).tensors.values()]
        loader = TensorLoader()
        fingerprint_all(refs, loader)  # map and fault the pages in before timing
        return {
            "file, 1 thread": best(lambda: [fingerprint_verified(r, loader) for r in refs], repeat),
            "file, all cores": best(lambda: fingerprint_all(refs, loader), repeat),
        }


def state_of(t: torch.Tensor, n: int) -> dict[str, torch.Tensor]:
    """``t``'s elements as ``n`` tensors of a model's spread of sizes (views, no copy): one in
    four is a small vector, the rest share the remainder evenly."""
    small = max(1, t.numel() // (64 * n))
    big = (t.numel() - small * (n // 4)) // (n - n // 4)
    out, pos = {}, 0
    for i in range(n):
        size = small if i % 4 == 3 else big
        out[f"t{i}"] = t[pos : pos + size]
        pos += size
    return out


def show(args: argparse.Namespace, report: dict[str, Any], title: str) -> bool:
    """Print ``report`` as JSON (``--json``; returns False) or its title and a row per
    measurement (returns True: the caller prints its ratios)."""
    if args.json:
        print(json.dumps(report, indent=2))
        return False
    print(title)
    for k, seconds in report["seconds"].items():
        print(f"  {k:<22} {seconds * 1e3:9.2f} ms  {report['gb_per_s'][k]:8.2f} GB/s")
    return True


def device_report(args: argparse.Namespace) -> None:
    """``--device cuda``: the tensor in GPU memory."""
    nbytes = args.size << 20
    t = torch.randn(nbytes // 4, generator=torch.Generator().manual_seed(0)).to(args.device)
    state = state_of(t, args.state_tensors)

    def copy() -> None:
        t.clone()
        torch.cuda.synchronize()

    host = fingerprint(t.cpu())
    assert fingerprint(t) == host, "the device fingerprint differs from the host's"
    results = {
        "device copy": best(copy, args.repeat),
        "fingerprint": best(lambda: fingerprint(t), args.repeat),
        "fingerprint fp1": best(lambda: fingerprint(t, scheme="ftkit-fp1"), args.repeat),
        "state": best(lambda: fingerprints(state), args.repeat),
    }
    gbps = {k: nbytes / v / 1e9 for k, v in results.items()}
    report = {"size_mib": args.size, "device": torch.cuda.get_device_name(), "seconds": results, "gb_per_s": gbps,
              "fp2_vs_fp1": gbps["fingerprint"] / gbps["fingerprint fp1"]}  # fmt: skip
    if not show(args, report, f"tensor: {args.size} MiB float32 on {report['device']}; state: {args.state_tensors}"):
        return
    print(f"fingerprint on the device: {gbps['fingerprint']:.0f} GB/s (target >= 200 on an H200)")
    print(f"fp2 on the device / fp1 streamed to the host: {report['fp2_vs_fp1']:.1f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1024, help="tensor size in MiB (default 1024)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tensors", type=int, default=8, help="tensors in the file of the file measurement")
    ap.add_argument("--state-tensors", type=int, default=200, help="tensors of the state measurement")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda: where the tensor is")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = ap.parse_args()
    if args.device != "cpu":
        device_report(args)
        return
    nbytes = args.size << 20
    t = torch.randn(nbytes // 4, generator=torch.Generator().manual_seed(0))
    src = t.numpy()
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in before timing
    strided = t.reshape(-1, 1024)[:, ::2]  # half the bytes, every other column
    results = {
        "memcpy": best(lambda: np.copyto(dst, src), args.repeat),
        "fingerprint": best(lambda: fingerprint(t), args.repeat),
        "fingerprint fp1": best(lambda: fingerprint(t, scheme="ftkit-fp1"), args.repeat),
        "state": best(lambda: fingerprints(state_of(t, args.state_tensors)), args.repeat),
        "state fp1": best(lambda: fingerprints(state_of(t, args.state_tensors), "ftkit-fp1"), args.repeat),
        "fingerprint_strided": best(lambda: fingerprint(strided), args.repeat),
        "sha256": best(lambda: hashlib.sha256(src).digest(), args.repeat),
        **file_fingerprints(t, args.tensors, args.repeat),
    }
    gbps = {k: (nbytes / 2 if k == "fingerprint_strided" else nbytes) / v / 1e9 for k, v in results.items()}
    report = {
        "size_mib": args.size,
        "threads": torch.get_num_threads(),
        "threads_ftkit": workers(),
        "seconds": results,
        "gb_per_s": gbps,
        "ratio_vs_memcpy": gbps["fingerprint"] / gbps["memcpy"],
        "fp2_vs_fp1": gbps["fingerprint"] / gbps["fingerprint fp1"],
        "file_all_cores_vs_memcpy": gbps["file, all cores"] / gbps["memcpy"],
        "speedup_vs_sha256": gbps["fingerprint"] / gbps["sha256"],
    }
    if not show(args, report, f"tensor: {args.size} MiB float32, torch threads {report['threads']}"):
        return
    print(f"fingerprint / memcpy throughput: {report['ratio_vs_memcpy']:.2f} (target >= 0.8)")
    print(f"ftkit-fp2 / ftkit-fp1 throughput: {report['fp2_vs_fp1']:.2f} (target: no slower, ~1)")
    print(
        f"file of {args.tensors} tensors, all {report['threads_ftkit']} cores / one core's memcpy: "
        f"{report['file_all_cores_vs_memcpy']:.2f} (target >= 1.5 on 2 cores)"
    )
    print(f"fingerprint / sha256 throughput: {report['speedup_vs_sha256']:.1f}x")


if __name__ == "__main__":
    main()
