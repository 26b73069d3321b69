"""A rank's state in the canonical (TP=1/PP=1) layout: model-wide names, shardings, the
collective gather that assembles a cell's state, and the inverse slice (``local_state``).

Checkpoints hold the canonical state whatever the layout of the run that wrote them (issue 8
section 2), so a run with other ``--cells``, ``--tp`` or ``--pp`` can load them.

Names: canonical tensors are named as the PP=1 model names them (``decoder.layers.<i>``
counted model-wide: ``ftkit.model.stages.global_param_name`` with the stage's layer offset);
optimizer entries are ``<param name>.<key>`` (``exp_avg``, ``exp_avg_sq``, ``step``).

Shardings: a rank's parameter relates to the canonical tensor as megatron's attributes say
(``ftkit.tensors.sharding.param_sharding``); an optimizer entry of the parameter's shape (the
AdamW moments) is sharded like its parameter, any other (the 0-d ``step``) is replicated
(``ftkit.tensors.sharding.entry_sharding``).

Contract:

* ``rank_shardings(named, tp_rank, tp_size, offset)``: ``{canonical name: Sharding}`` of a
  rank's parameters;
* ``canonical_names(state, offset)``: ``(params, optimizer)`` of a ``RankState`` under
  model-wide names (views, no copy);
* ``gather(named, optimizer, offset)``: **collective inside the cell** (every rank of the cell
  calls it, like ``ftkit.train.rank.pipeline.export_cell``): TP shards are all-gathered and
  assembled, the stages' parts are gathered to the cell's rank 0, which returns the canonical
  ``(params, optimizer)``; every other rank returns ``({}, {})``;
* ``local_state(params, optimizer, named, tp_rank, tp_size, offset)``: the inverse, local and
  without communication: this rank's own ``(params, optimizer)`` (stage-local names, its TP
  shards) sliced out of a canonical state, ready for ``ftkit.train.rank.state_codec.restore``;
  ``local_state(*gather(...))`` on every rank returns exactly what the rank held (tested);
* ``rank_spec(named, tp_rank, pp_rank, tp_size, offset)``: what a checkpoint records about a
  rank so that a verifier can slice the rank's shard out of the canonical state without torch
  or megatron and recompute the ``state_fingerprint`` total the rank logged
  (``ftkit.checkpoint.rank_totals``).

Heavy imports (torch, megatron) stay inside the functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ftkit.tensors.sharding import Sharding

if TYPE_CHECKING:
    from torch import Tensor

Named = list[tuple[str, Any]]


def rank_shardings(named: Named, tp_rank: int, tp_size: int, offset: int) -> dict[str, Sharding]:
    """``{canonical parameter name: Sharding}`` of this rank's ``(local name, parameter)`` pairs."""
    from ftkit.model.stages import global_param_name
    from ftkit.tensors.sharding import param_sharding

    return {global_param_name(n, offset): param_sharding(p, tp_rank, tp_size) for n, p in named}


def canonical_names(state: Any, offset: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(params, optimizer)`` of the ``RankState`` ``state`` under model-wide names."""
    from ftkit.model.stages import global_param_name

    params = {global_param_name(n, offset): t for n, t in state.params.items()}
    optimizer = {global_param_name(n, offset): t for n, t in state.optimizer.items()}
    return params, optimizer


def _owner(key: str) -> str:
    """The parameter an optimizer entry ``<param>.<key>`` belongs to."""
    return key.rsplit(".", 1)[0]


def gather(
    named: Named, optimizer: dict[str, Any], offset: int, copy: bool = True
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The cell's canonical ``(params, optimizer)`` on its rank 0, ``({}, {})`` elsewhere.

    ``named``: this rank's ``(local name, parameter)``; ``optimizer``: its entries
    ``{"<local param>.<key>": tensor}`` (``state_codec.capture``). Collective inside the cell:
    every rank calls it with the same structure per stage (see the module docstring). Returns
    CPU tensors that share nothing with the live state; with ``copy=False`` a CPU tensor that is
    not split over TP ranks is returned as it is (the caller reads it before the state changes).
    """
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from ftkit.model.stages import global_param_name
    from ftkit.tensors.sharding import entry_sharding, param_sharding

    tp_rank = ps.get_tensor_model_parallel_rank()
    tp_size = ps.get_tensor_model_parallel_world_size()
    shard = {n: param_sharding(p, tp_rank, tp_size) for n, p in named}
    shapes = {n: tuple(p.shape) for n, p in named}
    params = {global_param_name(n, offset): _full(p, shard[n], copy) for n, p in named}
    optim = {
        global_param_name(k, offset): _full(
            t, entry_sharding(shard[_owner(k)], shapes[_owner(k)], tuple(t.shape)), copy
        )
        for k, t in optimizer.items()
    }
    if ps.get_pipeline_model_parallel_world_size() == 1:
        return (params, optim) if dist.get_rank() == 0 else ({}, {})
    if tp_rank != 0:  # its TP peer on rank 0's side has the stage's whole part
        return {}, {}
    first = ps.is_pipeline_first_stage()
    parts: list[Any] | None = [None] * ps.get_pipeline_model_parallel_world_size() if first else None
    dist.gather_object(
        (params, optim),
        parts,
        dst=ps.get_pipeline_model_parallel_first_rank(),
        group=ps.get_pipeline_model_parallel_group(),
    )
    if not first or dist.get_rank() != 0:
        return {}, {}
    assert parts is not None  # gathered on the first stage
    merged: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
    for part_params, part_optim in parts:  # stage order = model order
        merged[0].update(part_params)
        merged[1].update(part_optim)
    return merged


def _full(t: Tensor, sh: Sharding, copy: bool = True) -> Any:
    """The canonical tensor of this rank's ``t`` (all-gather over the TP group when split);
    ``copy=False``: an unsplit CPU tensor is ``t`` itself, detached."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from ftkit.tensors.sharding import assemble

    if not sh.is_split:
        whole = t.detach().cpu()  # a device tensor's host copy already shares nothing
        return whole.clone() if copy and whole.data_ptr() == t.data_ptr() else whole
    assert sh.dim is not None  # a split sharding has a dim
    local = t.detach().contiguous()
    parts = [torch.empty_like(local) for _ in range(sh.tp_size)]
    dist.all_gather(parts, local, group=ps.get_tensor_model_parallel_group())
    return assemble([(Sharding.split(sh.dim, r, sh.tp_size, sh.stride), x.cpu()) for r, x in enumerate(parts)])


def local_state(
    params: dict[str, Tensor], optimizer: dict[str, Tensor], named: Named, tp_rank: int, tp_size: int, offset: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """This rank's ``(params, optimizer)`` (stage-local names, its TP shards) out of a canonical
    state (see the module docstring). ``ValueError`` when a parameter of the rank is missing
    from ``params`` or its shard does not have the rank's shape. Optimizer entries are those
    of the rank's parameters (``<canonical param>.<key>``, keys without dots); the slices are
    contiguous copies."""
    from ftkit.model.stages import global_param_name
    from ftkit.tensors.sharding import entry_sharding, param_sharding, shard_of

    local_params: dict[str, Any] = {}
    local_optim: dict[str, Any] = {}
    by_owner: dict[str, list[str]] = {}
    for key in optimizer:
        by_owner.setdefault(_owner(key), []).append(key)
    for name, p in named:
        canonical = global_param_name(name, offset)
        if canonical not in params:
            raise ValueError(f"the state holds no {canonical!r} (this rank's {name!r})")
        sh = param_sharding(p, tp_rank, tp_size)
        mine = shard_of(params[canonical], sh).contiguous()
        if tuple(mine.shape) != tuple(p.shape):
            raise ValueError(f"{canonical}: the state's shard is {list(mine.shape)}, the rank holds {list(p.shape)}")
        local_params[name] = mine
        for key in by_owner.get(canonical, []):
            t = optimizer[key]
            entry = entry_sharding(sh, tuple(params[canonical].shape), tuple(t.shape))
            local_optim[f"{name}.{key[len(canonical) + 1 :]}"] = shard_of(t, entry).contiguous()
    return local_params, local_optim


def rank_spec(named: Named, tp_rank: int, pp_rank: int, tp_size: int, offset: int) -> dict[str, Any]:
    """JSON-able ``{"tp_rank", "pp_rank", "params": {local name: [canonical name, sharding]}}``
    of this rank (``ftkit.checkpoint.rank_totals`` reads it)."""
    from ftkit.model.stages import global_param_name
    from ftkit.tensors.sharding import param_sharding

    return {
        "tp_rank": tp_rank,
        "pp_rank": pp_rank,
        "params": {n: [global_param_name(n, offset), param_sharding(p, tp_rank, tp_size).to_dict()] for n, p in named},
    }
