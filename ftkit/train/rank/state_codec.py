"""The one codec of a rank's complete state: heal transfers it, the final state and checkpoints reuse it.

``RankState`` is everything a rank needs to continue training bitwise like its peers:

* ``params``: ``{name: parameter}`` (megatron's ``named_parameters()`` names);
* ``optimizer``: ``{"<param>.<key>": tensor}`` (AdamW ``exp_avg``, ``exp_avg_sq``, ``step``);
* ``witness``: the witness table (``None`` on ranks without one);
* ``rng``: the CPU generator's state (uint8; micro-shards reseed it, but it is state all the same);
* ``counters``: ``{"step": last committed step (-1 before the first), "rollout": its rollout}``;
  the exact reducer keeps no state between steps (scales are recomputed per step from the
  gradients), so there is no reducer entry.

``encode(state) -> (tensors, meta)`` flattens it for transport or a safetensors file: each
underlying *storage* appears once, as ``storage/<i>`` (a 1-D tensor over the whole storage, no
copy), and ``meta`` (``dict[str, str]``) says how every named tensor is a view of one:
``meta["view/<name>"] = json [storage, dtype, offset, shape, stride]``, plus
``meta["counters"]`` (json) and ``meta["codec"] = CODEC``. Two tensors sharing a storage (a
fused buffer, a view) are sent once and come back sharing again.
``decode(tensors, meta) -> RankState`` rebuilds the views (no copy either: they view the
received storages). Names are ``param/<name>``, ``optimizer/<name>``, ``witness``, ``rng``.

``capture(...)`` reads a worker's live state (views, no copy): heal encodes it, and
``rank_state.save_final`` writes the final state from it; ``restore(...)`` copies a decoded
state into a worker's model, optimizer and witness in place.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import Tensor
    from torch.optim import Optimizer

CODEC = "ftkit.rank-state/1"


@dataclass
class RankState:
    """A rank's complete training state (see the module docstring)."""

    params: dict[str, Any]
    optimizer: dict[str, Any]
    witness: Any
    rng: Any
    counters: dict[str, int] = field(default_factory=dict)

    def named(self) -> dict[str, Any]:
        """Every tensor under its codec name."""
        out = {f"param/{n}": t for n, t in self.params.items()}
        out.update({f"optimizer/{n}": t for n, t in self.optimizer.items()})
        if self.witness is not None:
            out["witness"] = self.witness
        out["rng"] = self.rng
        return out


def encode(state: RankState) -> tuple[dict[str, Any], dict[str, str]]:
    """``(tensors, meta)``: every storage once plus how each named tensor views it."""
    import torch

    storages: dict[tuple[int, str], str] = {}
    tensors: dict[str, Any] = {}
    meta: dict[str, str] = {"codec": CODEC, "counters": json.dumps(state.counters, sort_keys=True)}
    for name, t in state.named().items():
        storage = t.untyped_storage()
        key = (storage.data_ptr(), str(t.device))
        if key not in storages:
            storages[key] = f"storage/{len(storages)}"
            tensors[storages[key]] = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
        view = [storages[key], str(t.dtype).removeprefix("torch."), t.storage_offset(), list(t.shape), list(t.stride())]
        meta[f"view/{name}"] = json.dumps(view)
    return tensors, meta


def decode(tensors: dict[str, Tensor], meta: dict[str, str]) -> RankState:
    """The ``RankState`` of an ``encode`` result (views of ``tensors``' storages)."""
    import torch

    if meta.get("codec") != CODEC:
        raise ValueError(f"not a rank state (codec {meta.get('codec')!r}, expected {CODEC!r})")
    named: dict[str, Any] = {}
    for key, value in meta.items():
        if not key.startswith("view/"):
            continue
        storage, dtype, offset, shape, stride = json.loads(value)
        raw = tensors[storage]
        typed = raw.view(getattr(torch, dtype)) if raw.numel() else raw.to(getattr(torch, dtype))
        named[key.removeprefix("view/")] = typed.as_strided(shape, stride, offset)
    return RankState(
        params={n.removeprefix("param/"): t for n, t in named.items() if n.startswith("param/")},
        optimizer={n.removeprefix("optimizer/"): t for n, t in named.items() if n.startswith("optimizer/")},
        witness=named.get("witness"),
        rng=named["rng"],
        counters={k: int(v) for k, v in json.loads(meta["counters"]).items()},
    )


def state_bytes(tensors: dict[str, Tensor]) -> int:
    """Bytes an ``encode`` result carries (each storage once)."""
    return sum(int(t.numel()) * t.element_size() for t in tensors.values())


def capture(
    named: list[tuple[str, Tensor]], optimizer: Optimizer, witness: Tensor | None, counters: dict[str, int]
) -> RankState:
    """The live state of a rank (views, no copy); ``named``: its ``(name, parameter)`` pairs."""
    import torch

    optim: dict[str, Any] = {}
    for name, p in named:
        for key, value in sorted(optimizer.state.get(p, {}).items()):
            if isinstance(value, torch.Tensor):
                optim[f"{name}.{key}"] = value.detach()
    return RankState(
        params={n: p.detach() for n, p in named},
        optimizer=optim,
        witness=None if witness is None else witness.detach(),
        rng=torch.default_generator.get_state(),
        counters=dict(counters),
    )


def restore(
    state: RankState, named: list[tuple[str, Tensor]], optimizer: Optimizer, witness: Tensor | None, owned: bool = False
) -> None:
    """Copy ``state`` into the rank in place: parameters, optimizer state (replaced whole),
    witness table and RNG. Raises ``ValueError`` when names or shapes do not match.

    ``owned``: ``state``'s tensors are buffers nobody else holds (a heal's received
    storages): the optimizer state then *is* them where they already sit on the parameter's
    device (no copy, no second copy of the moments in memory); otherwise it is cloned."""
    import torch

    params = dict(named)
    if set(params) != set(state.params):
        missing, extra = sorted(set(params) - set(state.params)), sorted(set(state.params) - set(params))
        raise ValueError(f"rank state does not match the model (missing {missing[:3]}, unexpected {extra[:3]})")
    with torch.no_grad():
        for name, p in named:
            src = state.params[name]
            if src.shape != p.shape or src.dtype != p.dtype:
                raise ValueError(
                    f"{name}: received {src.dtype}{tuple(src.shape)}, the model holds {p.dtype}{tuple(p.shape)}"
                )
            if src.data_ptr() != p.data_ptr() or src.stride() != p.stride():  # not received in place
                p.copy_(src)
        optimizer.state.clear()
        for name, p in named:
            prefix = f"{name}."
            entries = {k.removeprefix(prefix): v for k, v in state.optimizer.items() if k.startswith(prefix)}
            entries = {k: v for k, v in entries.items() if "." not in k}
            if entries:
                optimizer.state[p] = {k: _own(v, p.device if v.dim() else v.device, owned) for k, v in entries.items()}
        if witness is not None and state.witness is not None:
            witness.copy_(state.witness)
    torch.default_generator.set_state(state.rng.clone().contiguous())


def _own(t: Tensor, device: torch.device | str, owned: bool) -> Any:
    """``t`` on ``device``, never sharing memory with the caller's tensor unless ``owned``."""
    if t.device == device:
        return t if owned else t.clone()
    return t.to(device)
