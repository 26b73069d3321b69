"""The per-rank state fingerprints of a checkpoint, recomputed from the tensors it stores.

A checkpoint holds the canonical TP=1/PP=1 state whatever the layout that wrote it, while each
rank of a TP x PP cell logs the ``state_fingerprint`` total of its *own* state: its stage's
parameters under stage-local names, its TP shards. So a checkpoint of a cell of several ranks
records, besides the canonical ``state_fingerprint``:

* ``MANIFEST.json`` ``rank_totals``: ``{rank: total}``, the totals the ranks held when the
  state was gathered (the totals they logged for the checkpoint's step);
* ``meta.json`` ``ranks``: ``{rank: {"tp_rank", "pp_rank", "params": {local name: [canonical
  name, sharding]}}}`` (``ftkit.train.rank.canonical_state.rank_spec``).

``check_rank_totals`` slices every rank's shard back out of the stored tensors
(``ftkit.tensors.sharding.shard_of``; optimizer entries per ``entry_sharding``), fingerprints
them under the rank's names (``param/<local>``, ``optimizer/<local>.<key>``), combines them and
requires the recorded total (FT202 otherwise, and when the spec is missing, names a tensor
the checkpoint lacks, or misses optimizer entries). With ``--events`` the recorded totals are
then compared with the log (FT214, ``bookkeeping.check_events``), so the chain stored tensors
-> rank totals -> committed fingerprints is checked end to end and fails closed. A checkpoint
of one rank needs none of this: its ``state_fingerprint`` is that rank's total. Reads with
numpy over a memory map (no torch).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ftkit.checkpoint.codes import Collector
from ftkit.checkpoint.layout import META
from ftkit.errors import InputError
from ftkit.tensors.untrusted import load_json


def check_rank_totals(name: str, path: Path, manifest: Any, col: Collector) -> None:
    """FT202 unless every rank's recorded total is the fingerprint of its shard of the stored
    state (see the module docstring). Call only for a checkpoint whose files verified."""
    if len(manifest.rank_totals) <= 1:
        return
    col.check("FT202", len(manifest.rank_totals))
    where = {"checkpoint": name, "file": str(path / META)}
    try:
        specs = _specs(load_json((path / META).read_bytes()), set(manifest.rank_totals))
        totals = _recompute(path, manifest.fingerprint_prefixes, specs, manifest.fingerprint_scheme)
    except (OSError, ValueError, KeyError, TypeError, InputError) as exc:
        message = exc.message if isinstance(exc, InputError) else str(exc)
        col.add("FT202", f"{name}: the rank totals cannot be recomputed from the checkpoint: {message}", **where)
        return
    for rank, want in sorted(manifest.rank_totals.items()):
        if totals[rank] != want:
            col.add(
                "FT202",
                f"{name}: rank {rank}'s shard of the stored state has total {totals[rank][:12]}, "
                f"the manifest records {want[:12]}",
                **where,
            )


def _specs(meta: Any, ranks: set[str]) -> dict[str, dict[str, tuple[str, Any]]]:
    """``{rank: {local name: (canonical name, Sharding)}}`` from meta.json's ``ranks``."""
    from ftkit.tensors.sharding import Sharding

    doc = meta.get("ranks") if isinstance(meta, dict) else None
    if not isinstance(doc, dict) or set(doc) != ranks:
        have = sorted(doc) if isinstance(doc, dict) else None
        raise ValueError(f"meta.json 'ranks' lists {have}, the manifest's rank_totals {sorted(ranks)}")
    out: dict[str, dict[str, tuple[str, Any]]] = {}
    for rank, spec in doc.items():
        params = spec["params"]
        if not isinstance(params, dict):
            raise TypeError(f"rank {rank}: 'params' is not an object")
        out[rank] = {str(local): (str(c), Sharding.from_dict(sh)) for local, (c, sh) in params.items()}
    return out


def _recompute(
    path: Path, prefixes: dict[str, str], specs: dict[str, dict[str, tuple[str, Any]]], scheme: str
) -> dict[str, str]:
    """``{rank: total}`` of every rank's shard of the stored state (fingerprints in ``scheme``)."""
    from ftkit.tensors.arrays import MappedFile
    from ftkit.tensors.fingerprint import combine, fingerprint_array
    from ftkit.tensors.sharding import entry_sharding, shard_of
    from ftkit.tensors.st import read_header

    by_prefix: dict[str, list[str]] = {}
    for fname, prefix in sorted(prefixes.items()):  # a group's shards share its prefix
        by_prefix.setdefault(prefix, []).append(fname)
    if set(by_prefix) != {"param/", "optimizer/"}:
        raise ValueError(f"fingerprint_prefixes {prefixes} do not name a model and an optimizer file")
    arrays: dict[str, dict[str, Any]] = {"param/": {}, "optimizer/": {}}
    for prefix, fnames in by_prefix.items():
        for fname in fnames:
            header, mapped = read_header(path / fname), MappedFile(path / fname)
            arrays[prefix].update({n: mapped.array(info) for n, info in header.tensors.items()})
    params, optim = arrays["param/"], arrays["optimizer/"]
    entries: dict[str, list[str]] = {}
    for key in optim:
        entries.setdefault(key.rsplit(".", 1)[0], []).append(key)
    totals: dict[str, str] = {}
    for rank, spec in specs.items():
        named: dict[str, str] = {}
        for local, (canonical, sh) in spec.items():
            if canonical not in params:
                raise ValueError(f"rank {rank}'s {local!r} is {canonical!r}, which the checkpoint does not hold")
            full = params[canonical]
            named[f"param/{local}"] = fingerprint_array(shard_of(full, sh), scheme)
            for key in entries.get(canonical, []):
                entry = entry_sharding(sh, full.shape, optim[key].shape)
                moment = shard_of(optim[key], entry)
                named[f"optimizer/{local}.{key[len(canonical) + 1 :]}"] = fingerprint_array(moment, scheme)
        totals[rank] = combine(named)
    return totals
