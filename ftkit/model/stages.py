"""Pipeline stages and the model-wide parameter names, shared by every model build, import and
the ranks that dump, checkpoint and export a stage.

Contract:

* ``stage_layer_offset(config)``: the index of this pipeline stage's first transformer layer
  (megatron's own even split of the layers over the stages).
* ``stage_position(model)``: ``(layer offset, is last stage)`` of this rank's pipeline stage;
  ``(0, True)`` without pipeline parallelism.
* ``global_param_name(name, offset)`` renames a stage-local parameter, module path or capture
  name (``decoder.layers.<i>.``) to the model-wide layer numbering (``<i + offset>``);
  ``local_param_name`` is its inverse. Dumps, the final state and checkpoints use the
  model-wide names, so a PP run pairs tensor for tensor with a PP=1 run.

This module sits below the builders (``ftkit.model.gpt``, ``ftkit.model.hf_build``) and the
importer (``ftkit.model.hf_import``): it imports none of them. Heavy imports (megatron) stay
inside the functions.
"""

from __future__ import annotations

import re
from typing import Any

_LAYER = re.compile(r"^(decoder\.layers\.)(\d+)(?=[.#]|$)")


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
