"""What scoring in the trainer's shapes costs the megatron engine (docs/engines.md, FT114 on CUDA).

The engine samples a rollout's responses in passes of ``GEN_CHUNK`` rows (one forward pass per
response token), then scores the ``[prompt | response]`` rows once more in passes of the
trainer's micro-shard rows (``MegatronEngine.score_chunk``). This times ``generate`` with and
without that scoring pass on the run's default shapes (or the options given) and prints the
ratio::

    PYTHONPATH=$PWD python bench/engine_rescore.py [--device cuda] [--samples 64] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--samples", type=int, default=64, help="samples per rollout (the default run's)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    import torch

    from ftkit.engines.megatron import MegatronEngine
    from ftkit.model.gpt import build_gpt, configure_determinism, init_local_parallel
    from ftkit.train.config import TrainConfig
    from ftkit.train.plan.run_plan import build_plan
    from ftkit.train.rl.engines import GEN_CHUNK

    plan = build_plan(TrainConfig(device=args.device, samples_per_rollout=args.samples))
    cfg, task = plan.config, plan.task.build()
    configure_determinism(cfg.compute.threads_per_rank)
    init_local_parallel(args.device)
    model = build_gpt(plan.model, cfg.rng.seed, args.device).eval()
    prompts = task.prompts(cfg.rng.seed, 0, args.samples).tolist()
    seeds = list(range(args.samples))

    def timed(score_chunk: int) -> float:
        engine = MegatronEngine(
            model, args.device, pad_token=task.pad_token, chunk=GEN_CHUNK, vocab_size=task.vocab_size,
            score_chunk=score_chunk,
        )  # fmt: skip
        best = float("inf")
        for _ in range(args.repeat):
            if args.device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            engine.generate(prompts, task.response_len, seeds, allowed=task.response_tokens)
            if args.device == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        return best

    plain, scored = timed(0), timed(cfg.batch.shard_samples)
    print(
        f"{args.samples} samples x {task.response_len} tokens on {args.device}: sampling alone {plain * 1e3:.1f} ms, "
        f"with the scoring pass in {cfg.batch.shard_samples}-row micro-shard shapes {scored * 1e3:.1f} ms "
        f"({scored / plain:.2f}x)"
    )


if __name__ == "__main__":
    main()
