"""The megatron-core ``GPTModel`` of an ``HFArch`` for the TP x PP layout of this process.

Contract:

* ``transformer_config(arch, tp, pp, device, dtype)``: RMSNorm (``norm_eps``), SwiGLU
  (``gated_linear_unit`` + silu), grouped-query attention (``num_query_groups``,
  ``kv_channels=head_dim``), no linear biases except Qwen2's QKV bias, Qwen3's QK-norm, dropout
  off, the deterministic and unfused paths ftkit's presets use; ``perform_initialization`` is off
  (the weights are loaded next, ``ftkit.model.hf_import``). ``dtype`` is the parameters' storage
  (``params_dtype``) and nothing else: every other field (``bf16``, ``pipeline_dtype``) is the
  float32 build's, so a model built in bf16 computes exactly as one built in float32 and cast.
* ``layer_spec(arch, device)``: Transformer Engine's spec on CUDA where installed, else
  megatron's local spec with ftkit's causal, GQA-capable ``SDPAttention`` (``attention.py``).
* ``build_hf_gpt(arch, device, dtype)``: the model, every parameter in ``dtype``, of megatron's
  *already initialised* parallel state (``ftkit.model.gpt.init_local_parallel`` for a world of
  one): this rank's pipeline stage with ``pre_process`` / ``post_process``, the vocabulary
  padded to ``arch.padded_vocab``, RoPE with ``rope_theta`` (and Llama-3 scaling), tied
  embeddings when the config ties them.
  On CPU the rotary embedding is ``ftkit.model.rope``'s (megatron's moves itself to CUDA).
  ``uses_te(device)`` says whether the TE names apply (``hf_layout.entries(te=...)``); the
  preset build (``ftkit.model.gpt``) asks it too.
* ``build_loaded(arch, model_dir, device, dtype)``: ``build_hf_gpt``, its weights loaded
  (``ftkit.model.hf_import.load_into``) and its padded vocabulary masked in the loss
  (``mask_padded_vocab``): what a run trains and its engines sample from. ``dtype`` is the one
  the caller computes in: a checkpoint stored wholly in it is built in it, so its parameters are
  the file's bits read straight into place (a bf16 checkpoint for a bf16 run: no float32 copy of
  the model); anything else (a float32 or float16 checkpoint, a mixed one, a float32 run) is
  built in float32, loaded with an exact upcast, and the caller casts it.

Heavy imports (torch, megatron) stay inside the functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ftkit.model.hf_config import HFArch


def torch_dtype(name: str) -> Any:
    """``"bfloat16"`` -> ``torch.bfloat16`` (the names of ``hf_config.DTYPES``)."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def precision_dtype(precision: str) -> str:
    """The dtype name of the weights a model computes with in ``precision`` (``fp32``, ``bf16``:
    ``--precision`` of ``ftkit train`` and ``ftkit check-model``)."""
    return {"fp32": "float32", "bf16": "bfloat16"}[precision]


def _te_available() -> bool:
    try:
        import transformer_engine  # noqa: F401
    except Exception:
        return False
    return True


def uses_te(device: str) -> bool:
    """Whether ``layer_spec`` picks Transformer Engine on ``device``."""
    return device == "cuda" and _te_available()


def transformer_config(arch: HFArch, tp: int, pp: int, device: str, dtype: str = "float32") -> Any:
    """The megatron ``TransformerConfig`` of ``arch`` for a TP x PP layout (module contract)."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    arch.check_layout(tp, pp)
    td = torch_dtype(dtype)
    return TransformerConfig(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_heads,
        num_query_groups=arch.num_kv_heads,
        kv_channels=arch.head_dim,
        ffn_hidden_size=arch.ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=arch.norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_norm,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        sequence_parallel=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=td,
        pipeline_dtype=torch.float32,
        use_cpu_initialization=not uses_te(device),
        perform_initialization=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        bias_activation_fusion=False,
        deterministic_mode=True,
    )


def layer_spec(arch: HFArch, device: str) -> Any:
    """The transformer-layer spec for ``arch`` on ``device`` (module contract)."""
    from megatron.core.models.gpt import gpt_layer_specs as specs

    if uses_te(device):
        return specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=arch.qk_norm)
    from ftkit.model.attention import SDPAttention

    spec = specs.get_gpt_layer_local_spec(qk_layernorm=arch.qk_norm, normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = SDPAttention
    return spec


def build_hf_gpt(arch: HFArch, device: str, dtype: str = "float32", parallel_output: bool = True) -> Any:
    """This rank's ``GPTModel`` of ``arch``, weights not yet loaded (module contract)."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel

    tp = ps.get_tensor_model_parallel_world_size()
    pp = ps.get_pipeline_model_parallel_world_size()
    model = GPTModel(
        config=transformer_config(arch, tp, pp, device, dtype),
        transformer_layer_spec=layer_spec(arch, device),
        vocab_size=arch.padded_vocab,
        max_sequence_length=arch.max_seq_len,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
        parallel_output=parallel_output,
        share_embeddings_and_output_weights=arch.tied,
        position_embedding_type="rope",
        rotary_percent=1.0,
        rotary_base=arch.rope_theta,
        rope_scaling=arch.rope_scaling_factor is not None,
        rope_scaling_factor=arch.rope_scaling_factor or 8.0,
    )
    mark_tp_shards(model)
    if device == "cpu":
        from ftkit.model.rope import cpu_rotary

        cpu_rotary(model)
    return model.to(device=device, dtype=torch_dtype(dtype))  # megatron builds its torch norms in float32


def build_loaded(arch: HFArch, model_dir: Path, device: str, dtype: str = "float32") -> Any:
    """This rank's ``GPTModel`` of the Hugging Face model in ``model_dir`` (of architecture
    ``arch``), its weights loaded and its padded vocabulary masked (module contract), for
    megatron's already initialised parallel state: in ``dtype`` when the checkpoint is stored
    wholly in it, else in float32."""
    from ftkit.model.hf_import import load_into, stored_dtype

    built = dtype if stored_dtype(Path(model_dir), arch) == dtype else "float32"
    model = build_hf_gpt(arch, device, built)
    load_into(model, Path(model_dir), arch, te=uses_te(device))
    mask_padded_vocab(model, arch.vocab_size)
    return model


def mask_padded_vocab(model: Any, vocab_size: int) -> None:
    """Make the loss of ``model`` (megatron's vocab-parallel cross entropy, ``GPTModel(...,
    labels=...)``) see the logits of the padded vocabulary rows (``>= vocab_size``) of this TP
    shard as ``-inf``, so it is the loss over the model's own vocabulary and the padded rows get
    no gradient (they stay as loaded). The output layer's output itself (what a dump captures,
    what ``labels=None`` returns) is left finite: a caller without labels reads only real token
    ids (the engines sample the task's tokens). Nothing on a stage without an output layer or a
    shard without padding."""
    import torch
    from megatron.core import parallel_state as ps

    layer = getattr(model, "output_layer", None)
    if layer is None or not getattr(model, "post_process", False):
        return
    width = layer.output_size_per_partition
    start = ps.get_tensor_model_parallel_rank() * width
    padded = torch.arange(start, start + width) >= vocab_size
    if not bool(padded.any()):
        return
    loss = model.compute_language_model_loss

    def masked_loss(labels: Any, logits: Any) -> Any:
        return loss(labels, logits.masked_fill(padded.to(logits.device), float("-inf")))

    model.compute_language_model_loss = masked_loss


def mark_tp_shards(model: Any) -> None:
    """Give each TP-split weight of ``model`` megatron's ``tensor_model_parallel`` /
    ``partition_dim`` / ``partition_stride`` attributes where it has none.

    megatron sets them on a weight only where it initialises it (``perform_initialization``);
    ftkit builds with that off and loads the weights itself, so without this every weight would
    look replicated to what reads them: the cell's canonical state (the weights sent to engines,
    heal, checkpoints' canonical form) and the optimizer's grad-norm (a TP duplicate counted
    once). Vocabulary embedding and column-parallel weights split on dim 0 (the gated MLP's
    ``linear_fc1`` with stride 2: each rank holds its part of gate, then of up), row-parallel
    weights on dim 1. Biases already carry them (megatron sets those unconditionally)."""
    from megatron.core.tensor_parallel.layers import (
        ColumnParallelLinear,
        RowParallelLinear,
        VocabParallelEmbedding,
        set_tensor_model_parallel_attributes,
    )

    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if weight is None or hasattr(weight, "tensor_model_parallel"):
            continue
        if isinstance(module, VocabParallelEmbedding):
            dim, stride = 0, 1
        elif isinstance(module, ColumnParallelLinear):
            dim, stride = 0, 2 if name.endswith("mlp.linear_fc1") and module.config.gated_linear_unit else 1
        elif isinstance(module, RowParallelLinear):
            dim, stride = 1, 1
        else:
            continue
        set_tensor_model_parallel_attributes(weight, True, dim, stride)
