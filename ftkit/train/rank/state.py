"""The state of one rank: naming, fingerprints and the final state file
(the state itself is read by ``ftkit.train.rank.state_codec.capture``).

Names (shared by fingerprints, the final state and dumps):

* parameters: megatron's ``named_parameters()`` names (``decoder.layers.0.mlp.linear_fc1.weight``);
* optimizer state: ``<param name>.<state key>`` (``...weight.exp_avg``, ``...weight.exp_avg_sq``,
  ``...weight.step``) for every tensor in ``optimizer.state[param]``.

Fingerprints and heal use the rank's own (stage-local) names; the final state file, dumps and
checkpoints use model-wide names (``ftkit.train.rank.canonical_state``). The witness table is not a
model parameter and not in the optimizer, so it appears in none of these.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

from ftkit.evidence.fingerprint import fingerprint_state  # noqa: F401 - the one routine, re-exported

FINAL_SCHEMA = "ftkit.final-state/1"


def final_path(run_dir: str | Path, tp: int, pp: int) -> Path:
    """``<run_dir>/final/tp{t}-pp{p}.safetensors``."""
    return Path(run_dir) / "final" / f"tp{tp}-pp{pp}.safetensors"


def save_final(
    run_dir: str | Path,
    state: Any,
    tp: int,
    pp: int,
    meta: dict[str, str],
    offset: int = 0,
    shardings: dict[str, Any] | None = None,
) -> Path:
    """Write a rank's ``RankState`` (``ftkit.train.rank.state_codec``: the one definition of a rank's
    state) atomically to ``final_path``: its parameters as ``model.<name>`` and its optimizer
    state as ``optimizer.<param>.<key>``, named model-wide (``offset``: the stage's first layer,
    see ``ftkit.train.rank.canonical_state``), its step and rollout counters in the metadata
    (``step``, ``rollout``); returns the path. ``shardings`` (``{canonical parameter name:
    Sharding}``): the TP split tensors are listed in the metadata key ``sharding`` (JSON
    ``{tensor key: sharding}``), so ``compare-dumps`` reassembles them and pairs ``final/`` of
    any layout tensor for tensor with a TP=1/PP=1 run. The witness table and the RNG state are
    not part of the final state (they carry no learned value)."""
    import json

    from ftkit.tensors.sharding import entry_sharding
    from ftkit.tensors.st import write_safetensors_atomic
    from ftkit.train.rank.canonical_state import canonical_names

    params, optimizer = canonical_names(state, offset)
    tensors = {f"model.{n}": t for n, t in params.items()}
    tensors.update({f"optimizer.{n}": t for n, t in optimizer.items()})
    shardings = shardings or {}
    split = {f"model.{n}": sh.to_dict() for n, sh in shardings.items() if sh.is_split}
    for key, t in optimizer.items():
        owner = key.rsplit(".", 1)[0]
        sh = shardings.get(owner)
        if sh is not None and entry_sharding(sh, tuple(params[owner].shape), tuple(t.shape)).is_split:
            split[f"optimizer.{key}"] = sh.to_dict()
    counters = {k: str(v) for k, v in state.counters.items()}
    if split:
        meta = {**meta, "sharding": json.dumps(split, sort_keys=True)}
    path = final_path(run_dir, tp, pp)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_safetensors_atomic(path, tensors, metadata={"schema": FINAL_SCHEMA, **meta, **counters})
    return path
