"""Building the megatron-core GPT model a run trains, on CPU or CUDA.

Contract:

* ``init_local_parallel(device)`` makes this process a torch.distributed world of one
  (a private ``HashStore``; gloo on CPU, nccl on CUDA) and initialises megatron's parallel
  state with TP = PP = 1. Engines, the plain baseline loop and tests use it. It is a no-op
  when a world already exists.
* ``build_gpt(model, seed, device, dtype="float32")`` builds the ``GPTModel`` of a ``ModelSpec``
  (``ftkit.model.spec``) for the TP/PP layout of megatron's *already initialised* parallel
  state: a Hugging Face model is built and loaded by ``ftkit.model.hf_build.build_loaded``; a
  preset is drawn from ``seed``, deterministically: the weights depend on ``seed`` only.
  ``dtype`` is the one the caller computes in: a Hugging Face checkpoint stored in it is built
  in it (its bits, no float32 copy); a preset (drawn in float32) and any other checkpoint are
  built in float32, and the caller casts (``.to(dtype)``, a no-op where the build already is). On CPU
  every weight is initialised through megatron's CPU path (``use_cpu_initialization``), which
  draws the full master weight from the torch generator and keeps this rank's slice, so a TP=2
  cell holds exactly the slices of the TP=1 model of the same seed. On CUDA with Transformer
  Engine the TE spec is used and its init follows megatron's CUDA RNG tracker (seeded by
  ``model_parallel_cuda_manual_seed``). With PP > 1 each rank builds its stage (megatron's
  ``pre_process`` / ``post_process`` and its even layer split) and copies its weights from the
  PP=1 model of the same seed, built once on every rank, so a PP cell holds exactly the
  weights of the PP=1 model (stage names: ``ftkit.model.stages``).
* ``configure_determinism(threads)`` is called by every rank before it builds or trains:
  deterministic kernels, a fixed intra-op thread count (never derived from the host), and
  on CUDA deterministic cuBLAS / Transformer Engine attention and a pinned NCCL algorithm.

Heavy imports (torch, megatron) stay inside the functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ftkit.model.hf_build import uses_te
from ftkit.model.presets import get_preset
from ftkit.model.stages import global_param_name, stage_layer_offset

if TYPE_CHECKING:
    from ftkit.model.spec import ModelSpec


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


def init_local_parallel(device: str, cuda_index: int = 0) -> None:
    """Make this process a world of one and initialise megatron parallel state (TP=PP=1);
    on CUDA on device ``cuda_index`` (0: the GPU Ray made visible)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    if not dist.is_initialized():
        backend = "nccl" if device == "cuda" else "gloo"
        if device == "cuda":
            torch.cuda.set_device(cuda_index)
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1, create_gloo_process_groups=False)


def layer_spec(device: str) -> Any:
    """The transformer-layer spec: Transformer Engine on CUDA when installed, else the local
    spec with ``SDPAttention`` as core attention (works on CPU and CUDA)."""
    from megatron.core.models.gpt import gpt_layer_specs as specs

    if uses_te(device):
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
        use_cpu_initialization=not uses_te(device),
        perform_initialization=True,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        deterministic_mode=True,
        pipeline_dtype=torch.float32,
    )


def build_gpt(model: ModelSpec, seed: int, device: str, dtype: str = "float32") -> Any:
    """The deterministic ``GPTModel`` of ``model`` on ``device`` (module contract).

    Megatron's parallel state must be initialised (by the cell's world or
    ``init_local_parallel``). The model has no witness; see ``ftkit.train.rank.witness``.
    """
    import torch
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    if not model.is_preset:
        from ftkit.model.hf_build import build_loaded

        return build_loaded(model.hf, model.hf_dir, device, dtype)
    p = get_preset(model.name)
    tp = parallel_state.get_tensor_model_parallel_world_size()
    pp = parallel_state.get_pipeline_model_parallel_world_size()
    torch.manual_seed(seed)
    if device == "cuda":
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        torch.cuda.manual_seed(seed)
        model_parallel_cuda_manual_seed(seed)

    def make(pp_size: int, pre: bool, post: bool) -> Any:
        return GPTModel(
            config=transformer_config(model.name, tp, pp_size, device),
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
