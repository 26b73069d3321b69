"""Canary log-probs: a fixed set of sequences scored after every weight sync, by every engine
and by the trainer, so an engine that did not take an update is caught whatever the batch.

The canary set is the run's first ``GEN_CHUNK`` held-out prompts with their correct
responses (``RlTask.heldout_prompts`` / ``correct_responses``): a function of the seed
only, in the engines' generation shape (``GEN_CHUNK`` rows of the full sequence length). An
engine scores it right after it loads a weights version (``EngineActor.load_weights``); each
cell's trainer rank 0 scores it at the first step of the rollout that version generated, when
its weights are that version (``ftkit.train.rank.compute``). Both log ``canary_logprobs`` with
the policy's float32 log-probs of the response tokens (``ftkit.engines.policy``), flattened
row-major; rule FT114 compares them per version: bit for bit at TP=1, within its tolerance at
TP > 1. A batch can be too small, or too uninformative, to show stale weights through the
rollout's own log-probs; the canary set is the same every time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ftkit.tasks.protocols import RlTask


def canary_tokens(task: RlTask, seed: int, rows: int) -> tuple[Any, Any]:
    """``(tokens, mask)``: int64 and float32 ``[rows, seq_len]`` (engines and trainers pass
    ``engines.GEN_CHUNK``, the engines' usual shape), the prompts followed by their correct
    responses, and 1 where a learned response token is predicted (``loss_mask``'s layout)."""
    import torch

    prompts = task.heldout_prompts(seed, rows)
    tokens = torch.cat([prompts, task.correct_responses(prompts)], dim=1)
    p = prompts.shape[1]
    mask = torch.zeros(tokens.shape, dtype=torch.float32)
    mask[:, p - 1 : p - 1 + task.response_len] = task.response_mask(tokens[:, p:])
    return tokens, mask


def canary_fields(logprobs: Any, mask: Any) -> dict[str, Any]:
    """The event fields of a canary score: the masked log-probs flattened row-major (float32
    values as Python floats: JSON round-trips them exactly)."""
    values = logprobs.detach().cpu().float()[mask.bool()]
    return {"rows": int(mask.shape[0]), "logprobs": [float(x) for x in values.tolist()]}
