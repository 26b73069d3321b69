"""``ftkit check-model``'s library: logit parity of ftkit's megatron-core model against
``transformers`` on CPU, and, beyond the tolerance, the first layer whose output differs.

``check_model(path, prompts, atol, rtol, precision)``: ``path`` is a Hugging Face directory or a
``.gguf`` file (converted once, ``ftkit.model.gguf_cache``). Both models run on CPU in this
process (megatron at TP = PP = 1, a world of one) on each prompt as the model's tokenizer encodes
it, in ``precision``: ``fp32`` (float32 weights and compute) or ``bf16`` (the weights a bf16 run
computes with: ftkit's model as ``ftkit.model.hf_build.build_loaded`` builds it for a bf16 run and
cast to bfloat16, transformers' loaded with ``dtype=torch.bfloat16``; both compute in bf16).
``TOLERANCES[precision]`` is the default ``(atol, rtol)`` of each (docs/models.md: bf16 rounds
to 8 significant bits, and two correct bf16 implementations that order their sums differently
drift apart by a few per cent of the largest logit over a model's depth). Per prompt: the max abs
difference of the logits (the real vocabulary, padding cut), the max relative difference
``max|a - b| / max|b|``, the share of positions whose argmax agrees, the max difference of the
per-token log-probabilities of the prompt's own next tokens, the next token each side predicts
(decoded) and ``next_margin``, how far below transformers' top logit its logit of ftkit's next
token is (0 when they agree). A prompt passes when ``max_abs <= limit = atol + rtol * max|b|``
and the next tokens agree or tie within the limit (``next_margin <= limit``).

When a prompt fails, both forwards of that prompt are captured with ``ModuleCapture``, the
corresponding outputs (embedding, per layer: input norm, attention, post-attention norm, MLP,
layer output; final norm; logits) are written under common names in megatron's order and in one
layout ([batch, sequence, ...]) with ``DumpWriter`` into two dump trees, and ``compare_paths``
compares them with one rule per output (``ftkit.dumps.rules``): its ``max_abs`` at most ``atol +
rtol * max|its transformers output|``, the logit criterion applied to each layer. Its first
divergence is the first differing layer (finding CM003). Codes: ``CODES``.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftkit.findings import Finding, RuleSummary, RuleTable, Severity
from ftkit.model.parity_prompts import encode_prompts

CODES = RuleTable(
    {
        "CM001": (
            "logit-parity",
            Severity.error,
            "logits differ by more than atol + rtol * max|reference| on a prompt",
        ),
        "CM002": (
            "next-token",
            Severity.error,
            "ftkit and transformers predict a different next token (not a tie within the logit limit)",
        ),
        "CM003": (
            "first-divergence",
            Severity.error,
            "the first layer output outside the tolerance (when CM001 fails)",
        ),
    }
)


@dataclass
class PromptParity:
    prompt: str
    tokens: int
    max_abs: float
    max_rel: float
    argmax_agree: float  # share of positions
    logprob_max_diff: float
    next_ftkit: str
    next_reference: str
    next_margin: float  # transformers' top logit minus its logit of ftkit's next token (0: the same token)
    limit: float  # atol + rtol * max|reference logits|

    @property
    def within(self) -> bool:
        return self.max_abs <= self.limit

    @property
    def next_agrees(self) -> bool:
        """The same next token, or a tie within the limit (bf16 may order near-equal logits either way)."""
        return self.next_margin <= self.limit

    def to_dict(self) -> dict[str, Any]:
        return {**vars(self), "within": self.within, "next_agrees": self.next_agrees}


#: the default ``(atol, rtol)`` of each precision (docs/models.md, "ftkit check-model")
TOLERANCES = {"fp32": (1e-4, 1e-4), "bf16": (1e-2, 1e-1)}


@dataclass
class ParityResult:
    model: str
    family: str
    atol: float
    rtol: float
    precision: str
    prompts: list[PromptParity] = field(default_factory=list)
    first_divergence: dict[str, Any] | None = None
    findings: list[Finding] = field(default_factory=list)
    rules: list[RuleSummary] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # built-in prompts skipped, a short long prompt


def _layer_names(num_layers: int) -> list[tuple[str, str, str]]:
    """``(common name, megatron capture name, transformers capture name)`` in forward order."""
    out = [("embedding", "embedding.output", "model.embed_tokens.output")]
    for i in range(num_layers):
        m, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        out += [
            (f"layers.{i}.input_norm", m + "input_layernorm.output", h + "input_layernorm.output"),
            (f"layers.{i}.attention", m + "self_attention.output.0", h + "self_attn.output.0"),
            (f"layers.{i}.post_attention_norm", m + "pre_mlp_layernorm.output", h + "post_attention_layernorm.output"),
            (f"layers.{i}.mlp", m + "mlp.output.0", h + "mlp.output"),
            (f"layers.{i}.output", m + "output.0", h + "output"),
        ]
    return out + [
        ("final_norm", "decoder.final_layernorm.output", "model.norm.output"),
        ("logits", "output", "lm_head.output"),
    ]


def load_pair(model_dir: Path, precision: str = "fp32") -> tuple[Any, Any, Any, Any]:
    """``(arch, megatron model, transformers model, tokenizer)`` of ``model_dir``, eval, both in
    ``precision`` (``fp32`` or ``bf16``, module contract)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ftkit.errors import InputError
    from ftkit.model.families import load_arch
    from ftkit.model.gpt import init_local_parallel
    from ftkit.model.hf_build import build_loaded, precision_dtype, torch_dtype

    name = precision_dtype(precision)
    arch = load_arch(model_dir)
    init_local_parallel("cpu")
    model = build_loaded(arch, model_dir, "cpu", name).to(torch_dtype(name)).eval()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    except (OSError, ValueError) as exc:
        raise InputError(f"{model_dir} has no usable tokenizer: {exc}", "the directory needs tokenizer.json") from None
    reference = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch_dtype(name)).eval()
    return arch, model, reference, tokenizer


def _forward(model: Any, reference: Any, ids: Any, vocab: int, capture: bool) -> tuple[Any, Any, list[Any], list[Any]]:
    import torch

    from ftkit.dumps.capture import ModuleCapture

    pos = torch.arange(ids.shape[1])[None]
    with torch.no_grad(), ModuleCapture(model, grads=False, tp_rank=0, tp_size=1) as ca:
        ours = model(ids, pos, None)[..., :vocab]
    with torch.no_grad(), ModuleCapture(reference, grads=False, tp_rank=0, tp_size=1) as cb:
        ref = reference(ids).logits
    return ours, ref, (ca.take() if capture else []), (cb.take() if capture else [])


def _measure(prompt: str, ours: Any, ref: Any, ids: Any, tokenizer: Any, atol: float, rtol: float) -> PromptParity:
    import torch

    a, b = ours[0].double(), ref[0].double()
    diff = (a - b).abs()
    scale = b.abs().max().item()
    lp_a, lp_b = torch.log_softmax(a, -1), torch.log_softmax(b, -1)
    nxt = ids[0, 1:]
    tok_a, tok_b = lp_a[:-1].gather(1, nxt[:, None]), lp_b[:-1].gather(1, nxt[:, None])
    ours_next = int(a[-1].argmax())
    return PromptParity(
        prompt=prompt,
        tokens=int(ids.shape[1]),
        max_abs=diff.max().item(),
        max_rel=diff.max().item() / scale if scale else 0.0,
        argmax_agree=(a.argmax(-1) == b.argmax(-1)).double().mean().item(),
        logprob_max_diff=(tok_a - tok_b).abs().max().item() if nxt.numel() else 0.0,
        next_ftkit=tokenizer.decode([ours_next]),
        next_reference=tokenizer.decode([int(b[-1].argmax())]),
        next_margin=(b[-1].max() - b[-1, ours_next]).item(),
        limit=atol + rtol * scale,
    )


def _limit(b: Any, atol: float, rtol: float) -> float:
    """``atol + rtol * max|b|`` over ``b``'s finite elements (the tolerance of one output)."""
    import torch

    finite = b[torch.isfinite(b)]
    return atol + rtol * (finite.abs().max().double().item() if finite.numel() else 0.0)


def _locate(num_layers: int, ours: list[Any], ref: list[Any], atol: float, rtol: float) -> dict[str, Any] | None:
    """Dump both captures under common names and run the comparator, each output held to its
    own limit (``_limit`` of its transformers side); its first divergence."""
    import re

    from ftkit.dumps.compare import CompareOptions, compare_paths
    from ftkit.dumps.rules import rule_set
    from ftkit.dumps.writer import DumpWriter

    got_a = {c.name: c.tensor for c in ours}
    got_b = {c.name: c.tensor for c in ref}
    rules: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="ftkit-check-model-") as tmp:
        roots = Path(tmp) / "ftkit", Path(tmp) / "transformers"
        writers = [DumpWriter(root, "check", "forward", 0, "model") for root in roots]
        for common, m_name, h_name in _layer_names(num_layers):
            if m_name not in got_a or h_name not in got_b:
                continue
            a, b = got_a[m_name], got_b[h_name]
            if m_name != "output":  # megatron's [sequence, batch, ...] -> [batch, sequence, ...]
                a = a.transpose(0, 1)
            if common == "logits":
                a = a[..., : b.shape[-1]]
            writers[0].add(common, a.contiguous(), step=0)
            writers[1].add(common, b.contiguous(), step=0)
            limit = _limit(b, atol, rtol)
            rules.append((f":{re.escape(common)}$", f"max_abs <= {limit!r} and nonfinite_mismatch == 0"))
        for w in writers:
            w.write()
        options = CompareOptions(mode="rules", rules=rule_set(rules, "check-model's layer limits"))
        result = compare_paths(roots[0], roots[1], options)
    first = result.first_divergence
    if first is None:
        return None
    m = first.metrics
    return {"layer": first.name, "status": first.status, "max_abs": m.max_abs if m else None, "detail": first.message}


def check_model(
    path: Path, prompts: list[str] | None, atol: float, rtol: float, precision: str = "fp32"
) -> ParityResult:
    """Run the parity check of the model at ``path`` in ``precision`` (module contract) on
    ``prompts`` (``None``: the built-in set, ``ftkit.model.parity_prompts``; ``InputError`` for a
    prompt that cannot be compared: no token, or longer than the model or its sliding window)."""
    import json

    from ftkit.model.gguf_cache import hf_dir_for

    model_dir = hf_dir_for(Path(path))
    arch, model, reference, tokenizer = load_pair(model_dir, precision)
    window = json.loads((model_dir / "config.json").read_text()).get("sliding_window")
    encoded, warnings = encode_prompts(tokenizer, arch, prompts, window if isinstance(window, int) else None)
    result = compare_models(str(path), arch, model, reference, tokenizer, encoded, atol, rtol, precision)
    result.warnings = warnings
    return result


def compare_models(
    name: str,
    arch: Any,
    model: Any,
    reference: Any,
    tokenizer: Any,
    prompts: list[tuple[str, Any]],
    atol: float,
    rtol: float,
    precision: str = "fp32",
) -> ParityResult:
    """The parity result of a built megatron ``model`` against ``reference`` (both on CPU, in
    ``precision``) on ``prompts``, ``(label, ids [1, T])`` each (``encode_prompts``)."""
    result = ParityResult(model=name, family=arch.family, atol=atol, rtol=rtol, precision=precision)
    checked = {"CM001": 0, "CM002": 0, "CM003": 0}
    for prompt, ids in prompts:
        first_failure = result.first_divergence is None
        ours, ref, cap_a, cap_b = _forward(model, reference, ids, arch.vocab_size, capture=False)
        p = _measure(prompt, ours, ref, ids, tokenizer, atol, rtol)
        result.prompts.append(p)
        checked["CM001"] += 1
        checked["CM002"] += 1
        if not p.within:
            result.findings.append(
                CODES.finding(
                    "CM001",
                    f"prompt {prompt!r}: logits differ by up to {p.max_abs:.3g} (limit {p.limit:.3g})",
                    prompt=prompt,
                    max_abs=p.max_abs,
                    limit=p.limit,
                )
            )
            if first_failure:
                checked["CM003"] += 1
                _, _, cap_a, cap_b = _forward(model, reference, ids, arch.vocab_size, capture=True)
                result.first_divergence = _locate(arch.num_layers, cap_a, cap_b, atol, rtol) or {"layer": "none"}
                layer = result.first_divergence["layer"]
                result.findings.append(
                    CODES.finding(
                        "CM003",
                        f"prompt {prompt!r}: the first output outside the tolerance is {layer}",
                        prompt=prompt,
                        tensor=layer,
                    )
                )
        if not p.next_agrees:
            result.findings.append(
                CODES.finding(
                    "CM002",
                    f"prompt {prompt!r}: ftkit predicts {p.next_ftkit!r}, transformers {p.next_reference!r} "
                    f"(its logit {p.next_margin:.3g} above ftkit's token, limit {p.limit:.3g})",
                    prompt=prompt,
                )
            )
    result.rules = CODES.summaries(checked, result.findings)
    return result
