"""State fingerprints: a module's parameters and its optimizer's state, the way ftkit logs them.

``fingerprint_state(model, optimizer)`` is the one routine (``ftkit train``'s ranks call it too,
through ``ftkit.train.rank_state``): per-tensor fingerprints (``ftkit.tensors.fingerprint``) of
every ``named_parameters()`` entry and of every tensor in ``optimizer.state[param]`` (named
``<param name>.<state key>``), and one order-independent ``total`` over both with the
``param/`` and ``optimizer/`` prefixes, which is also the ``state_fingerprint`` of a checkpoint
that stores the same tensors (``ftkit.evidence.checkpoints``). ``unwrap`` removes the wrappers
of ``DistributedDataParallel`` and ``torch.compile`` so every rank names its tensors alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside ``DistributedDataParallel`` / ``torch.compile`` wrappers (else ``model``)."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model = inner


def fingerprint_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    named: Iterable[tuple[str, torch.Tensor]] | None = None,
) -> tuple[str, dict[str, str], dict[str, str]]:
    """``(total, params, optimizer)``: per-tensor fingerprints and one state fingerprint.

    ``total`` combines both maps with ``param/`` and ``optimizer/`` name prefixes, so a
    parameter and an optimizer tensor can never stand in for each other. ``named``: the
    model's ``(name, parameter)`` pairs when the caller keeps them (saves walking the module
    tree every step). ``optimizer`` may be ``None`` (parameters only).
    """
    import torch

    from ftkit.tensors.fingerprint import fingerprints, state_total

    tensors: dict[str, torch.Tensor] = {}
    optim_tensors: dict[str, torch.Tensor] = {}
    state = optimizer.state if optimizer is not None else {}
    for name, p in model.named_parameters() if named is None else named:
        tensors[name] = p
        for key, value in sorted(state.get(p, {}).items()):
            if isinstance(value, torch.Tensor):
                optim_tensors[f"{name}.{key}"] = value
    # one batch for both maps: on a GPU, one copy of the chunk digests for the whole state
    keyed = {("p", n): t for n, t in tensors.items()} | {("o", n): t for n, t in optim_tensors.items()}
    both = fingerprints(keyed)
    params = {n: both[("p", n)] for n in tensors}
    optim = {n: both[("o", n)] for n in optim_tensors}
    return state_total(params, optim), params, optim


def named_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``({param name: tensor}, {"<param name>.<key>": tensor})``: the tensors ``fingerprint_state``
    fingerprints, under the same names (what a checkpoint of the state stores)."""
    import torch

    params: dict[str, torch.Tensor] = {}
    optim: dict[str, torch.Tensor] = {}
    state = optimizer.state if optimizer is not None else {}
    for name, p in model.named_parameters():
        params[name] = p.detach()
        for key, value in sorted(state.get(p, {}).items()):
            if isinstance(value, torch.Tensor):
                optim[f"{name}.{key}"] = value.detach()
    return params, optim
