"""Building the megatron-core GPT model of a preset, on CPU or CUDA.

Contract:

* ``init_local_parallel(device)`` makes this process a torch.distributed world of one
  (a private ``HashStore``; gloo on CPU, nccl on CUDA) and initialises megatron's parallel
  state with TP = PP = 1. Engines, the plain baseline loop and tests use it. It is a no-op
  when a world already exists.
* ``build_gpt(spec, device)`` builds the ``GPTModel`` of ``spec.preset`` (or, with
  ``spec.hf_dir``, of a Hugging Face model: ``build_hf``) for the TP/PP layout
  of megatron's *already initialised* parallel state. It is deterministic: the weights
  depend on ``spec.seed`` only. On CPU every weight is initialised through megatron's
  CPU path (``use_cpu_initialization``), which draws the full master weight from the torch
  generator and keeps this rank's slice, so a TP=2 cell holds exactly the slices of the
  TP=1 model of the same seed. On CUDA with Transformer Engine the TE spec is used and its
  init follows megatron's CUDA RNG tracker (seeded by ``model_parallel_cuda_manual_seed``).
  With PP > 1 each rank builds its stage (megatron's ``pre_process`` / ``post_process`` and
  its even layer split) and copies its weights from the PP=1 model of the same seed, built
  once on every rank, so a PP cell holds exactly the weights of the PP=1 model.
* ``global_param_name(name, offset)`` renames a stage-local parameter, module path or capture
  name (``decoder.layers.<i>.``) to the model-wide layer numbering (``<i + offset>``);
  ``local_param_name`` is its inverse. Dumps, the final state and checkpoints use the
  model-wide names, so a PP run pairs tensor for tensor with a PP=1 run.
* ``stage_position(model)``: ``(layer offset, is last stage)`` of this rank's pipeline stage.
* ``configure_determinism(threads)`` is called by every rank before it builds or trains:
  deterministic kernels, a fixed intra-op thread count (never derived from the host), and
  on CUDA deterministic cuBLAS / Transformer Engine attention and a pinned NCCL algorithm.

Heavy imports (torch, megatron) stay inside the functions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ftkit.model.presets import get_preset

_LAYER = re.compile(r"^(decoder\.layers\.)(\d+)(?=[.#]|$)")


def configure_determinism(threads: int) -> None:
    """Deterministic algorithms and exactly ``threads`` intra-op threads in this process."""
    import os

    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # Transformer Engine refuses megatron's deterministic_mode unless this is 0; a fixed NCCL
    # algorithm keeps TP all-reduces the same bits in every cell (set before any communicator).
    os.environ["NVTE_ALLOW_NONDETERMINISTIC_ALGO"] = "0"
    os.environ.setdefault("NCCL_ALGO", "Ring")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(threads)


def init_local_parallel(device: str) -> None:
    """Make this process a world of one and initialise megatron parallel state (TP=PP=1)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    if not dist.is_initialized():
        backend = "nccl" if device == "cuda" else "gloo"
        if device == "cuda":
            torch.cuda.set_device(0)
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1, create_gloo_process_groups=False)


def _te_available() -> bool:
    try:
        import transformer_engine  # noqa: F401
    except Exception:
        return False
    return True


def layer_spec(device: str) -> Any:
    """The transformer-layer spec: Transformer Engine on CUDA when installed, else the local
    spec with ``SDPAttention`` as core attention (works on CPU and CUDA)."""
    from megatron.core.models.gpt import gpt_layer_specs as specs

    if device == "cuda" and _te_available():
        return specs.get_gpt_layer_with_transformer_engine_spec()
    from ftkit.model.attention import SDPAttention

    spec = specs.get_gpt_layer_local_spec()
    spec.submodules.self_attention.submodules.core_attention = SDPAttention
    return spec


def transformer_config(model: str, tp: int, pp: int, device: str) -> Any:
    """The megatron ``TransformerConfig`` of preset ``model`` for a TP x PP layout."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    p = get_preset(model)
    return TransformerConfig(
        num_layers=p.num_layers,
        hidden_size=p.hidden_size,
        num_attention_heads=p.num_heads,
        ffn_hidden_size=p.ffn_hidden_size,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        sequence_parallel=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=0.02,
        params_dtype=torch.float32,
        use_cpu_initialization=not (device == "cuda" and _te_available()),
        perform_initialization=True,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        deterministic_mode=True,
        pipeline_dtype=torch.float32,
    )


@dataclass(frozen=True)
class GPTSpec:
    """What ``build_gpt`` builds: the preset (``ftkit.model.presets``) and the init seed, or,
    with ``hf_dir``, the Hugging Face model of that directory (``preset`` is then its path as
    the run names it and ``seed`` is unused: the weights are the checkpoint's)."""

    preset: str
    seed: int
    hf_dir: str | None = None


def build_hf(model_dir: str, device: str) -> Any:
    """This rank's float32 ``GPTModel`` of the Hugging Face model in ``model_dir``, its weights
    loaded (``hf_build``, ``hf_import``) and its padded vocabulary masked
    (``mask_padded_vocab``), for megatron's already initialised parallel state."""
    from pathlib import Path

    from ftkit.model import hf_build, hf_import
    from ftkit.model.families import load_arch

    arch = load_arch(Path(model_dir))
    model = hf_build.build_hf_gpt(arch, device, "float32")
    hf_import.load_into(model, Path(model_dir), arch, te=hf_build.uses_te(device))
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


def build_gpt(spec: GPTSpec, device: str) -> Any:
    """The deterministic ``GPTModel`` of ``spec`` on ``device``.

    Megatron's parallel state must be initialised (by the cell's world or
    ``init_local_parallel``). The model has no witness; see ``ftkit.train.rank.witness``.
    """
    import torch
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    if spec.hf_dir is not None:
        return build_hf(spec.hf_dir, device)
    p = get_preset(spec.preset)
    tp = parallel_state.get_tensor_model_parallel_world_size()
    pp = parallel_state.get_pipeline_model_parallel_world_size()
    torch.manual_seed(spec.seed)
    if device == "cuda":
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        torch.cuda.manual_seed(spec.seed)
        model_parallel_cuda_manual_seed(spec.seed)

    def make(pp_size: int, pre: bool, post: bool) -> Any:
        return GPTModel(
            config=transformer_config(spec.preset, tp, pp_size, device),
            transformer_layer_spec=layer_spec(device),
            vocab_size=p.vocab_size,
            max_sequence_length=p.max_seq_len,
            pre_process=pre,
            post_process=post,
            parallel_output=True,
            share_embeddings_and_output_weights=False,
            position_embedding_type="learned_absolute",
        )

    if pp == 1:
        return make(1, True, True).to(device)
    # A stage alone would draw its weights from the generator in another order than the PP=1
    # model (stage 1 has no embedding to draw first): draw the whole PP=1 model (megatron
    # builds every layer when the config says PP=1) and keep this stage's share of it.
    full = dict(make(1, True, True).named_parameters())
    stage = make(pp, parallel_state.is_pipeline_first_stage(), parallel_state.is_pipeline_last_stage())
    offset = stage_layer_offset(stage.config)
    with torch.no_grad():
        for name, param in stage.named_parameters():
            param.copy_(full[global_param_name(name, offset)])
    del full
    return stage.to(device)


def stage_layer_offset(config: Any) -> int:
    """Index of this pipeline stage's first transformer layer (megatron's own split)."""
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    return int(get_transformer_layer_offset(config))


def stage_position(model: Any) -> tuple[int, bool]:
    """``(layer offset, is the last stage)`` of this rank's pipeline stage; ``(0, True)`` without
    pipeline parallelism."""
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized() or ps.get_pipeline_model_parallel_world_size() == 1:
        return 0, True
    return stage_layer_offset(model.config), ps.is_pipeline_last_stage()


def global_param_name(name: str, offset: int) -> str:
    """``decoder.layers.<i>.rest`` -> ``decoder.layers.<i + offset>.rest``; other names unchanged.

    Also renames module paths and capture names (``decoder.layers.<i>#1.output``,
    ``decoder.layers.<i>``): anything whose layer index is followed by ``.``, ``#`` or nothing.
    """
    match = _LAYER.match(name)
    if not offset or match is None:
        return name
    index = int(match.group(2)) + offset
    if index < 0:
        raise ValueError(f"{name!r} is not a layer of a stage starting at layer {-offset}")
    return f"{match.group(1)}{index}{name[match.end(2) :]}"


def local_param_name(name: str, offset: int) -> str:
    """The inverse of ``global_param_name``: a model-wide name to this stage's numbering."""
    return global_param_name(name, -offset)
