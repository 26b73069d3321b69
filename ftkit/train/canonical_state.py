"""A rank's state in the canonical (TP=1/PP=1) layout: model-wide names, shardings, the
collective gather that assembles a cell's state, and the inverse slice (``local_state``).

Names: the canonical state is named as the PP=1 model names it (``decoder.layers.<i>`` counted
model-wide, ``ftkit.model.gpt.global_param_name`` with the stage's layer offset); optimizer
entries are ``<param name>.<key>`` (``exp_avg``, ``exp_avg_sq``, ``step``).

Shardings: a rank's parameter shard relates to the canonical tensor as megatron's attributes
say (``ftkit.tensors.sharding.param_sharding``); an optimizer entry of the parameter's shape
(the AdamW moments) is sharded like its parameter, any other (the 0-d ``step``) is replicated.

Contract:

* ``rank_shardings(named, tp_rank, tp_size, offset)``: ``{canonical name: Sharding}`` of a
  rank's parameters (used by the final state's metadata and by ``gather``/``local_state``);
* ``canonical_names(state, offset)``: ``(params, optimizer)`` of a ``RankState`` renamed to
  model-wide names (views, no copy).

Heavy imports (torch, megatron) stay inside the functions.
"""

from __future__ import annotations

from typing import Any

from ftkit.tensors.sharding import Sharding


def rank_shardings(named: list[tuple[str, Any]], tp_rank: int, tp_size: int, offset: int) -> dict[str, Sharding]:
    """``{canonical parameter name: Sharding}`` of this rank's ``(local name, parameter)`` pairs."""
    from ftkit.model.gpt import global_param_name
    from ftkit.tensors.sharding import param_sharding

    return {global_param_name(n, offset): param_sharding(p, tp_rank, tp_size) for n, p in named}


def entry_sharding(param: Sharding, param_shape: tuple[int, ...], shape: tuple[int, ...]) -> Sharding:
    """The sharding of an optimizer entry of a parameter sharded as ``param``: the parameter's
    when it has the parameter's (local) shape, else replicated."""
    return param if tuple(shape) == tuple(param_shape) else Sharding.replicated(param.tp_rank, param.tp_size)


def canonical_names(state: Any, offset: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(params, optimizer)`` of the ``RankState`` ``state`` under model-wide names."""
    from ftkit.model.gpt import global_param_name

    params = {global_param_name(n, offset): t for n, t in state.params.items()}
    optimizer = {global_param_name(n, offset): t for n, t in state.optimizer.items()}
    return params, optimizer
