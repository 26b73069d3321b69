"""The two runs' configs compared: the differences that determine the result first.

``config_diff(a, b, layout_a, layout_b)`` lists every field whose value differs (nested
configs flattened to dotted names), each classed as

- ``result``: it changes the numbers (seed, learning rate, model, data, the eval prompt file
  (it decides the logged ``eval_reward`` and which checkpoints are kept), precision, loss,
  batch shape, reduction, the tp x pp layout: a tensor-parallel split changes the bits of the
  matmuls), listed first in the order of ``FIRST``, then the other fields nobody declared
  neutral (a field ftkit does not know is assumed to matter: a torchrun script's own flags);
- ``length``: how long the run is (rollouts, epochs, steps): common steps still compare;
- ``neutral``: what I3 makes irrelevant to the bits (cell count, faults injected, retries,
  timeouts, healing, checkpoint and dump cadence, the output directory, where engines run).
A field one config lacks and ``ABSENT_MEANS`` knows is compared as its value then.
"""

from __future__ import annotations

from typing import Any

#: Result-determining fields, in the order they are named (the likeliest cause first).
FIRST = (
    "seed",
    "lr",
    "learning_rate",
    "model",
    "model_digest",
    "model_name_or_path",
    "dataset",
    "data",
    "prompts",
    "prompts_digest",
    "eval_prompts",
    "eval_prompts_digest",
    "precision",
    "dtype",
    "bf16",
    "fp16",
    "tp",
    "pp",
    "reduce",
    "loss",
)
LENGTH = frozenset({"rollouts", "epochs", "num_train_epochs", "max_steps", "steps", "total_steps"})
NEUTRAL = frozenset(
    {
        "cells",
        "num_cells",
        "engines",
        "num_engines",
        "out",
        "output_dir",
        "logging_dir",
        "overwrite",
        "overwrite_output_dir",
        "run_name",
        "inject",
        "chaos",
        "ray_address",
        "collective_timeout",
        "step_timeout",
        "heal_timeout",
        "reward_timeout",
        "min_cells",
        "max_retries",
        "heal",
        "dump_rollouts",
        "dump_what",
        "dump_cells",
        "checkpoint_every",
        "save_steps",
        "keep_last",
        "keep_best",
        "best_metric",
        "bookkeeping",
        "logprob_tolerance",
        "resume",
        "report_to",
        "logging_steps",
        "plant",
        "engine_placement",
    }
)
#: What a field means when a run's config does not hold it: it was added later, and runs
#: recorded before it had this value (an older ``ftkit train`` trained in float32, had no eval
#: prompt file, and sampled at temperature 1 without truncation or stop strings).
ABSENT_MEANS: dict[str, Any] = {
    "precision": "fp32",
    "eval_prompts": None,
    "eval_prompts_digest": "",
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "stop": [],
    "ignore_eos": False,
}


def flatten(config: dict[str, Any] | None, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    out: dict[str, Any] = {}
    for k, v in (config or {}).items():
        name = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{name}."))
        else:
            out[name] = v
    return out


def kind_of(name: str) -> str:
    """``result``, ``length`` or ``neutral`` for a (dotted) field name."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf in LENGTH:
        return "length"
    if leaf in NEUTRAL:
        return "neutral"
    return "result"


def config_diff(
    a: dict[str, Any] | None,
    b: dict[str, Any] | None,
    layout_a: dict[str, Any] | None = None,
    layout_b: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Rows ``{"field", "a", "b", "kind"}``: result-determining first (``FIRST`` order, then by
    name), then length, then neutral. The layouts (``run_started``'s tp, pp, cells) fill in what a
    config does not record."""
    fa, fb = flatten(a), flatten(b)
    for layout, flat in ((layout_a or {}, fa), (layout_b or {}, fb)):
        for k, v in layout.items():
            flat.setdefault(k, v)
    for k, v in ABSENT_MEANS.items():
        if (k in fa) != (k in fb):
            fa.setdefault(k, v), fb.setdefault(k, v)
    missing = object()
    rows = [
        {"field": k, "a": fa.get(k), "b": fb.get(k), "kind": kind_of(k)}
        for k in sorted(set(fa) | set(fb))
        if fa.get(k, missing) != fb.get(k, missing)
    ]
    rank = {"result": 0, "length": 1, "neutral": 2}
    first = {name: i for i, name in enumerate(FIRST)}
    rows.sort(
        key=lambda r: (rank[str(r["kind"])], first.get(str(r["field"]).rsplit(".", 1)[-1], len(FIRST)), str(r["field"]))
    )
    return rows


def describe(rows: list[dict[str, Any]], limit: int = 4) -> str:
    """``lr 0.005 vs 0.01, seed 0 vs 1`` of the result-determining rows ('' when none)."""
    result = [r for r in rows if r["kind"] == "result"]
    text = ", ".join(f"{r['field']} {_short(r['a'])} vs {_short(r['b'])}" for r in result[:limit])
    return text + (f" (+{len(result) - limit} more)" if len(result) > limit else "")


def _short(v: Any, limit: int = 40) -> str:
    text = repr(v)
    return text if len(text) <= limit else text[: limit - 3] + "..."
