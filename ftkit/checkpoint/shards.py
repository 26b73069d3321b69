"""Payload groups stored as shard files of a bounded size, and the rule that reads them back.

A payload *group* is what the caller names one file (``model.safetensors``,
``optimizer.safetensors``, ``extra.safetensors``, ...). The publisher stores a group as one
file or several, by ONE naming rule (the one Hugging Face checkpoints use):

* a group whose tensors fit in one shard keeps its plain name: ``optimizer.safetensors``;
* a larger group is split into ``n >= 2`` files ``optimizer-00001-of-0000n.safetensors`` ...
  ``optimizer-0000n-of-0000n.safetensors`` (five-digit, 1-based index and count).

``split`` packs whole tensors, in name order, into shards of at most ``shard_bytes`` of tensor
data; a tensor larger than that gets a shard of its own. Every shard is an ordinary
safetensors file with its own size, sha256 and tensor records in the manifest, so the sha256
of different shards runs on different cores. The same state and shard size always give the
same files.

``group_problems`` is the fail-closed rule for a manifest's file list (FT218): a group is either
its plain file or the complete set ``1..n`` of one ``n`` (no missing, extra or duplicated shard,
no plain file next to shards), and no tensor name appears in two files of the same group.
``group_of`` maps a file name to its group's plain name; readers merge a group's shards
(``merge``) and see exactly the ``{name: tensor}`` the caller published.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

SUFFIX = ".safetensors"
DEFAULT_SHARD_BYTES = 64 << 20  # measured against 16 and 256 MiB: docs/checkpoints.md "Layout"
_SHARD_RE = re.compile(r"(?P<stem>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.safetensors")
MAX_SHARDS = 99999
T = TypeVar("T")


def shard_name(group: str, index: int, count: int) -> str:
    """The file name of shard ``index`` (1-based) of ``count`` of ``group`` (a plain name);
    the plain name itself when ``count == 1``."""
    if count == 1:
        return group
    return f"{group[: -len(SUFFIX)]}-{index:05d}-of-{count:05d}{SUFFIX}"


def parse(fname: str) -> tuple[str, int, int] | None:
    """``(group, index, count)`` of a shard file name; None for a plain name."""
    m = _SHARD_RE.fullmatch(fname)
    if m is None:
        return None
    return m.group("stem") + SUFFIX, int(m.group("i")), int(m.group("n"))


def group_of(fname: str) -> str:
    """The group (plain file name) ``fname`` belongs to: itself unless it is a shard name."""
    parsed = parse(fname)
    return fname if parsed is None else parsed[0]


def is_shard_name(fname: str) -> bool:
    """Whether ``fname`` follows the shard pattern (a caller's group name must not)."""
    return parse(fname) is not None


def split(group: str, tensors: Mapping[str, T], nbytes: Mapping[str, int], shard_bytes: int) -> dict[str, dict[str, T]]:
    """``{file name: {name: tensor}}`` of ``group`` cut into shards of at most ``shard_bytes``
    of tensor data (``nbytes[name]`` each; whole tensors, name order; a tensor larger than
    ``shard_bytes`` alone in its shard). One file under the plain name when it all fits."""
    if shard_bytes <= 0:
        raise ValueError(f"shard size must be positive, not {shard_bytes}")
    shards: list[dict[str, T]] = [{}]
    used = 0
    for name in sorted(tensors):
        size = nbytes[name]
        if shards[-1] and used + size > shard_bytes:
            shards.append({})
            used = 0
        shards[-1][name] = tensors[name]
        used += size
    if len(shards) > MAX_SHARDS:
        raise ValueError(f"{group} would need {len(shards)} shards (at most {MAX_SHARDS}): raise the shard size")
    return {shard_name(group, i + 1, len(shards)): s for i, s in enumerate(shards)}


def groups(fnames: Iterable[str]) -> dict[str, list[str]]:
    """``{group: [its file names, sorted]}`` of the ``*.safetensors`` names in ``fnames``."""
    out: dict[str, list[str]] = {}
    for f in sorted(fnames):
        if f.endswith(SUFFIX):
            out.setdefault(group_of(f), []).append(f)
    return out


def group_problems(tensor_names: Mapping[str, Sequence[str]]) -> list[tuple[str, str]]:
    """``(group, problem)`` for every way the files in ``tensor_names`` (``{file name: its tensor
    names}``, the safetensors files a manifest lists) break the shard rule (module docstring)."""
    out: list[tuple[str, str]] = []
    for group, files in groups(tensor_names).items():
        parsed = [p for p in (parse(f) for f in files) if p is not None]
        if group in files and parsed:
            out.append((group, f"{group} is listed next to {len(parsed)} shard file(s) of the same group"))
        counts = sorted({n for _, _, n in parsed})
        if len(counts) > 1:
            out.append((group, f"shards of {group} disagree on the shard count ({', '.join(map(str, counts))})"))
        elif counts:
            n = counts[0]
            have = sorted(i for _, i, _ in parsed)
            missing = sorted(set(range(1, n + 1)) - set(have))
            extra = sorted(i for i in set(have) if not 1 <= i <= n)
            if n < 2:
                out.append((group, f"{group} is stored as 1 shard of 1 (one file keeps the plain name)"))
            if missing:
                out.append((group, f"shard(s) {_ids(missing)} of {n} of {group} are not listed"))
            if extra:
                out.append((group, f"shard(s) {_ids(extra)} of {group} lie outside 1..{n}"))
        seen: dict[str, str] = {}
        for f in files:
            for name in tensor_names[f]:
                if name in seen:
                    out.append((group, f"tensor {name!r} of {group} is in both {seen[name]} and {f}"))
                else:
                    seen[name] = f
    return out


def merge(parts: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{group: {name: tensor}}`` from ``{file name: {name: tensor}}`` (call on files whose
    manifest passed ``group_problems``: a tensor in two shards raises ``ValueError``)."""
    out: dict[str, dict[str, Any]] = {}
    for fname in sorted(parts):
        into = out.setdefault(group_of(fname), {})
        for name, t in parts[fname].items():
            if name in into:
                raise ValueError(f"tensor {name!r} of {group_of(fname)} is in two shards")
            into[name] = t
    return out


def _ids(ids: Sequence[int]) -> str:
    return ", ".join(str(i) for i in ids[:5]) + (f" (+{len(ids) - 5} more)" if len(ids) > 5 else "")
