"""Start-up of ``ftkit compare-dumps`` and ``ftkit dump`` on a tiny pair (issue 10, item 1).

Writes two tiny safetensors files (float32 and bfloat16, written with numpy and ml_dtypes, no
torch), then measures in the same run, best and median of ``--repeat`` wall times:

- ``python -c "import numpy"`` (the baseline);
- ``python -m ftkit compare-dumps A B`` (one tensor differs: exit 1);
- ``python -m ftkit dump A``;

and prints each command's excess over the baseline (target: at most 0.3 s) and whether torch
was imported on the way (it must not be). Usage::

    python bench/startup.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ml_dtypes
import numpy as np


def write_st(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """A minimal safetensors writer (numpy only)."""
    codes = {"float32": "F32", "bfloat16": "BF16"}
    header, offset, blobs = {}, 0, []
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a).tobytes()
        span = [offset, offset + len(raw)]
        header[name] = {"dtype": codes[a.dtype.name], "shape": list(a.shape), "data_offsets": span}
        offset += len(raw)
        blobs.append(raw)
    body = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body + b"".join(blobs))


def wall(argv: list[str], repeat: int) -> list[tuple[float, float]]:
    """``(wall seconds, CPU seconds)`` of ``repeat`` runs (CPU: user + system, from wait4)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        times.append((time.perf_counter() - t0, usage.ru_utime + usage.ru_stime))
        if os.waitstatus_to_exitcode(status) not in (0, 1):
            raise SystemExit(f"{argv} exited {os.waitstatus_to_exitcode(status)}")
    return times


def imports_torch(argv: list[str]) -> bool:
    code = (
        "import sys, runpy; sys.argv = ['ftkit', *sys.argv[1:]]\n"
        "try:\n    runpy.run_module('ftkit', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "sys.stderr.write('TORCH=%d' % ('torch' in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
    return "TORCH=1" in proc.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ftkit-startup-") as tmp:
        a, b = Path(tmp) / "a.safetensors", Path(tmp) / "b.safetensors"
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        write_st(a, {"w": x, "h": x.astype(ml_dtypes.bfloat16)})
        write_st(b, {"w": x + 1, "h": x.astype(ml_dtypes.bfloat16)})
        runs = {
            "python -c 'import numpy'": [sys.executable, "-c", "import numpy"],
            "ftkit compare-dumps A B": [sys.executable, "-m", "ftkit", "compare-dumps", str(a), str(b)],
            "ftkit dump A": [sys.executable, "-m", "ftkit", "dump", str(a)],
        }
        times = {k: wall(v, args.repeat) for k, v in runs.items()}
        base = min(w for w, _ in times["python -c 'import numpy'"])
        base_cpu = min(c for _, c in times["python -c 'import numpy'"])
        print(f"start-up, best / median of {args.repeat} (same run); CPU = user + system seconds:")
        for k, ts in times.items():
            walls, cpus = [w for w, _ in ts], [c for _, c in ts]
            extra = (
                ""
                if k.startswith("python")
                else f"   excess wall {min(walls) - base:+.3f} s, CPU {min(cpus) - base_cpu:+.3f} s (target <= 0.300)"
            )
            med = statistics.median(walls)
            print(f"  {k:<26} wall {min(walls):6.3f} / {med:6.3f} s, CPU {min(cpus):6.3f} s{extra}")
        for k in ("ftkit compare-dumps A B", "ftkit dump A"):
            print(f"  {k}: torch imported: {imports_torch(runs[k][3:])}")


if __name__ == "__main__":
    main()
