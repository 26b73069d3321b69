"""The megatron engine scores in the trainer's shapes (FT114 bitwise at TP=1, CUDA included):
the log-probs it reports for sampled responses are the trainer's micro-shard computation bit for
bit, whatever pass a sample falls in (a short last pass is filled to the micro-shard's rows), and
the canary scores are the trainer's canary computation. The sampling pass runs its own shapes
(the tokens so far, the output layer at one position), so its log-probs are close to the
trainer's, not equal, on any device; only the shared shapes are (tests/train/test_cuda_paths.py
runs this same check on a GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

#: Runs in a fresh process (a world of one for megatron): prints one JSON line of checks.
SCORING_CHECK = textwrap.dedent(
    """
    import json, sys
    import torch
    from ftkit.engines.megatron import MegatronEngine
    from ftkit.engines.policy import allowed_index, policy_logprobs, truncate
    from ftkit.model.gpt import build_gpt, configure_determinism, init_local_parallel
    from ftkit.train.config import TrainConfig
    from ftkit.train.plan.run_plan import build_plan
    from ftkit.train.rl.canary import canary_tokens
    from ftkit.train.rl.engines import GEN_CHUNK

    device = sys.argv[1]
    T, P, K = (float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 2 else (1.0, 1.0, 0)
    sampling = dict(temperature=T, top_p=P, top_k=K)
    plan = build_plan(TrainConfig(device=device, samples_per_rollout=48, micro_shards=4, response_len=6))
    cfg, task = plan.config, plan.task.build()
    shard = cfg.batch.shard_samples  # 6 rows: passes of 6, the last one of a 16-sample call short
    configure_determinism(1)
    init_local_parallel(device)
    model = build_gpt(plan.model, cfg.rng.seed, device).eval()

    def engine(score_chunk):
        return MegatronEngine(model, device, pad_token=task.pad_token, chunk=GEN_CHUNK,
                              vocab_size=task.vocab_size, score_chunk=score_chunk)

    allowed = torch.tensor(task.response_tokens, dtype=torch.int64)
    index = allowed_index(task.response_tokens, model.vocab_size)

    def logits(tokens):
        tokens = tokens.to(device)
        pos = torch.arange(tokens.shape[1], device=device).unsqueeze(0).expand_as(tokens)
        with torch.no_grad():
            return model(tokens, pos, None)

    def trainer(tokens, temperature=T):  # StepCompute: policy_logprobs of the model's logits, on the device
        return policy_logprobs(logits(tokens), tokens.to(device), allowed, index, temperature).cpu()

    prompts = task.prompts(cfg.rng.seed, 0, 16)
    p, r, n = prompts.shape[1], task.response_len, prompts.shape[0]
    seeds = list(range(100, 100 + n))
    gens = engine(shard).generate(prompts.tolist(), r, seeds, allowed=task.response_tokens, **sampling)
    sampled = engine(0).generate(prompts.tolist(), r, seeds, allowed=task.response_tokens, **sampling)
    responses = torch.tensor([g.tokens.tolist() for g in gens])
    reported = torch.tensor([g.logprobs.tolist() for g in gens])
    tokens = torch.cat([prompts, responses], dim=1)
    by_shard = torch.cat([trainer(tokens[a:a + shard])[:, p - 1:p - 1 + r] for a in range(0, n, shard)])
    canary, _ = canary_tokens(task, cfg.rng.seed, GEN_CHUNK)
    canary_engine = torch.from_numpy(engine(shard).score_rows(canary.tolist(), task.response_tokens))
    # every sampled token is one top-k / top-p kept at its position (greedy: the argmax)
    at = logits(tokens)[:, p - 1 : p - 1 + r][..., allowed].double().cpu()
    picked = index[responses]
    if T == 0:
        kept = bool(torch.equal(at.argmax(-1), picked))
    else:
        probs = torch.softmax(at / T, dim=-1).reshape(n * r, -1)
        kept = bool((truncate(probs, P, K).gather(1, picked.reshape(-1, 1)) > 0).all())
    out = {
        "same_samples": [g.tokens.tolist() for g in gens] == [g.tokens.tolist() for g in sampled],
        "reported_is_trainer": bool(torch.equal(reported.view(torch.int32), by_shard.view(torch.int32))),
        "sampling_pass_is_close": bool(torch.allclose(
            torch.tensor([g.logprobs.tolist() for g in sampled]), by_shard, rtol=0, atol=1e-4)),
        "canary_is_trainer": bool(torch.equal(canary_engine.view(torch.int32), trainer(canary, 1.0).view(torch.int32))),
        "kept": kept,
        "short_pass": bool(torch.equal(
            torch.tensor([g.logprobs.tolist() for g in engine(shard).generate(
                prompts[:5].tolist(), r, seeds[:5], allowed=task.response_tokens, **sampling)]).view(torch.int32),
            reported[:5].view(torch.int32))),
    }
    print(json.dumps(out))
    """
)


def run_scoring_check(device: str, *sampling: str) -> dict[str, bool]:
    """``SCORING_CHECK`` on ``device`` in a fresh process (``sampling``: temperature, top-p,
    top-k): its checks by name."""
    argv = [sys.executable, "-c", SCORING_CHECK, device, *sampling]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_engine_reports_the_trainers_log_probs_bit_for_bit_on_cpu():
    assert run_scoring_check("cpu") == {
        "same_samples": True,  # scoring again changes no sample
        "reported_is_trainer": True,  # micro-shard shapes: the trainer's bits
        "sampling_pass_is_close": True,  # its own shapes (the tokens so far, one output position): close, not equal
        "canary_is_trainer": True,  # on the device, in the trainer's canary shape
        "kept": True,
        "short_pass": True,  # a sample's log-probs do not depend on the pass it falls in
    }


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [("0.7", "0.9", "5"), ("0", "1", "0"), ("1.3", "0.5", "0")])
def test_under_every_sampling_setting_the_engine_reports_the_trainers_log_probs(sampling: tuple[str, ...]):
    """Temperature, top-k and top-p, and greedy (temperature 0): the samples come from what
    top-k / top-p keep (greedy: the argmax), and the reported log-probs are the trainer's at the
    run's temperature, before truncation, bit for bit (the convention of ftkit.engines.policy)."""
    checks = run_scoring_check("cpu", *sampling)
    assert checks == dict.fromkeys(checks, True) and len(checks) == 6
