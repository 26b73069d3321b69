"""From a rank's state to a checkpoint payload, and from a run's checkpoints back to a state.

The training side stores a state in the TP=1/PP=1 layout as three payload groups, each one
file or, past the publisher's shard size, shard files (``optimizer-00001-of-00003.safetensors``,
``ftkit.checkpoint.shards``; readers get the group back whole):

* ``model.safetensors``: ``{parameter name: tensor}`` (fingerprint prefix ``param/``);
* ``optimizer.safetensors``: ``{"<param>.<key>": tensor}`` (prefix ``optimizer/``);
* ``extra.safetensors``: everything else a resumed run needs (RNG state, witness table,
  counters as int64 scalars, ...), not part of the state fingerprint.

With those prefixes the manifest's ``state_fingerprint`` is the ``total`` of the
``state_fingerprint`` event a TP=1/PP=1 rank logs at the checkpoint's step. A cell of several
ranks (TP or PP > 1) stores the same canonical state; its ranks' own totals go into
``rank_totals`` and their shard specs into ``meta["ranks"]`` (``ftkit.checkpoint.rank_totals``
recomputes each total from the stored tensors; ``ftkit.train.rank.canonical_state.local_state``
slices a rank's state back out for a run of any layout).

Which checkpoint ``--resume`` takes is ``ftkit.checkpoint.selection.newest_trusted``.
``load(checkpoint)`` verifies (unless the caller just did: ``verified=True``, so ``--resume``
hashes the checkpoint once) and reads the tensors with the safetensors reader, each group's
shards merged (``read_groups``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from ftkit.checkpoint.layout import EXTRA, MODEL, OPTIMIZER, STATE_PREFIXES
from ftkit.checkpoint.publish import Payload
from ftkit.errors import InputError
from ftkit.tensors.untrusted import load_json


def state_payload(
    params: Mapping[str, Any],
    optimizer: Mapping[str, Any],
    extra: Mapping[str, Any],
    meta: Mapping[str, Any],
    rank_totals: Mapping[str, str] | None = None,
) -> Payload:
    """The ``Payload`` of a TP=1/PP=1 state (tensors as torch tensors or numpy arrays)."""
    return Payload(
        files={MODEL: dict(params), OPTIMIZER: dict(optimizer), EXTRA: dict(extra)},
        meta=dict(meta),
        fingerprint_prefixes=STATE_PREFIXES,
        rank_totals=dict(rank_totals or {}),
    )


def load(checkpoint: Path, verified: bool = False) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """``({group: {name: torch tensor}}, meta)`` of a checkpoint that verifies; ``InputError``
    else. ``verified=True``: the caller verified it a moment ago (``newest_trusted``); the
    manifest's file list still passes the shard rule before anything is read."""
    from ftkit.checkpoint.layout import META
    from ftkit.checkpoint.verify import verify_path

    if not verified:
        errors = [f for f in verify_path(checkpoint).findings if f.severity.value == "error"]
        if errors:
            raise InputError(
                f"checkpoint {checkpoint} does not verify: {errors[0].code} {errors[0].message}",
                f"run 'ftkit verify-checkpoint {checkpoint}' for every finding",
            )
    return read_groups(checkpoint), load_json((checkpoint / META).read_bytes())


def read_groups(checkpoint: Path, only: Collection[str] | None = None) -> dict[str, dict[str, Any]]:
    """``{group: {name: torch tensor}}`` of the safetensors files the manifest of ``checkpoint``
    lists (of the groups in ``only``, e.g. ``{MODEL}``, when given), each group's shards merged
    (``shards.merge``). ``InputError`` when the list breaks the shard rule (FT218). Reads only;
    verify the checkpoint first."""
    from safetensors.torch import load_file

    from ftkit.checkpoint.layout import MANIFEST
    from ftkit.checkpoint.manifest import ManifestError
    from ftkit.checkpoint.manifest import load as load_manifest
    from ftkit.checkpoint.shards import group_of, group_problems, merge

    try:
        man, _ = load_manifest(checkpoint / MANIFEST)
    except ManifestError as exc:
        raise InputError(f"checkpoint {checkpoint}: {exc}", f"run 'ftkit verify-checkpoint {checkpoint}'") from None
    listed = {name: list(e.tensors) for name, e in man.files.items() if e.tensors is not None}
    problems = group_problems(listed)
    if problems:
        raise InputError(
            f"checkpoint {checkpoint}: FT218 {problems[0][1]}", f"run 'ftkit verify-checkpoint {checkpoint}'"
        )
    wanted = [name for name in listed if only is None or group_of(name) in only]
    return merge({name: load_file(str(checkpoint / name)) for name in wanted})
