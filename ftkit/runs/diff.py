"""The values of the matched items compared: ``Tolerance`` and ``compare_item``.

State fingerprints, witness digests and the weights sent are fingerprints: equal or not, and
for the first differing ones the kept per-tensor detail names the tensor (``differing_tensors``
of the replica rule: parameters, then ``optimizer/`` state) or the sample. Metrics and canary
log-probs are numbers: equal to the bit by default (NaN equals NaN; the runs claim bitwise
equality), or within ``|a - b| <= atol + rtol * |b|`` when a tolerance is given.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from ftkit.analysis.rules.replicas import differing_tensors

#: Metrics that measure time, speed or retries, not the numerics (a faulted run retries, a
#: loaded machine is slower): never compared. ``--ignore-metric`` adds names.
VOLATILE = re.compile(
    r"(^|_)(s|ms|sec|secs|seconds|time|runtime|per_s|per_sec|per_second|throughput|attempts|retries|flos)$"
)


@dataclass(frozen=True)
class Tolerance:
    """``exact`` (both None): bits; else ``|a - b| <= atol + rtol * |b|`` (missing one: 0)."""

    rtol: float | None = None
    atol: float | None = None

    @property
    def exact(self) -> bool:
        return self.rtol is None and self.atol is None

    def describe(self) -> str:
        return "exact (bitwise)" if self.exact else f"rtol {self.rtol or 0:g}, atol {self.atol or 0:g}"

    def close(self, a: Any, b: Any) -> bool:
        if a == b:
            return True
        if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
            return a is None and b is None
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        if self.exact:
            return False
        return abs(a - b) <= (self.atol or 0.0) + (self.rtol or 0.0) * abs(b)


@dataclass
class ItemDiff:
    """One item that differs: its kind, position and what to say about it."""

    kind: str
    key: tuple[Any, ...]
    rollout: int
    step: int  # -1: a rollout-level item (weights, canary, per-rollout metrics)
    message: str
    tensor: str | None = None
    evidence: dict[str, Any] | None = None


def compare_item(
    kind: str, a: Any, b: Any, detail_a: Any, detail_b: Any, tol: Tolerance, ignore: frozenset[str]
) -> tuple[bool, str, str | None, dict[str, Any]] | None:
    """``(equal, message, tensor, evidence)`` of one item both runs hold; None when nothing in it
    can be compared (metrics of disjoint names, all ignored)."""
    if kind == "state":
        return _state(a, b, detail_a, detail_b)
    if kind == "witness":
        return _witness(a, b, detail_a, detail_b)
    if kind == "weights":
        if a == b:
            return True, "", None, {}
        names = differing_tensors((detail_a, {}), (detail_b, {})) if detail_a and detail_b else []
        tensor = names[0] if names else None
        return (
            False,
            f"total {a[:12]} vs {b[:12]}" + (f"; first differing tensor {tensor}" if tensor else ""),
            tensor,
            {"tensors": names},
        )
    if kind in ("metric", "rmetric"):
        return _metrics(a, b, tol, ignore)
    return _canary(a, b, tol)


def _state(a: Any, b: Any, da: Any, db: Any) -> tuple[bool, str, str | None, dict[str, Any]]:
    if a == b:
        return True, "", None, {}
    ra, rb = dict(a), dict(b)
    if set(ra) != set(rb):
        return False, f"the runs' ranks differ ({sorted(ra, key=str)} vs {sorted(rb, key=str)})", None, {}
    rank = next(r for r in ra if ra[r] != rb[r])
    names: list[str] = []
    if da and db and rank in da and rank in db:
        names = differing_tensors(da[rank], db[rank])
    tensor = names[0] if names else None
    where = f"rank {rank}: " if len(ra) > 1 or rank not in (0, None) else ""
    text = f"{where}total {ra[rank][:12]} vs {rb[rank][:12]}"
    text += f"; first differing tensor {tensor}" if tensor else "; per-tensor detail not kept"
    return False, text, tensor, {"rank": rank, "tensors": names}


def _witness(a: Any, b: Any, da: Any, db: Any) -> tuple[bool, str, str | None, dict[str, Any]]:
    if a == b:
        return True, "", None, {}
    if not (da and db):
        return False, "witness ids or counts differ", None, {}
    ca, cb = dict(zip(*da)), dict(zip(*db))
    only_a, only_b = sorted(set(ca) - set(cb)), sorted(set(cb) - set(ca))
    counts = sorted(i for i in set(ca) & set(cb) if ca[i] != cb[i])
    parts = []
    if only_a:
        parts.append(f"samples {_ids(only_a)} trained only in A")
    if only_b:
        parts.append(f"samples {_ids(only_b)} trained only in B")
    if counts:
        parts.append(f"samples {_ids(counts)} counted differently ({ca[counts[0]]} vs {cb[counts[0]]})")
    return False, "; ".join(parts) or "witness order differs", None, {"samples": (only_a + only_b + counts)[:20]}


def _ids(ids: list[int], limit: int = 6) -> str:
    return ", ".join(map(str, ids[:limit])) + (f" (+{len(ids) - limit})" if len(ids) > limit else "")


def _metrics(
    a: Any, b: Any, tol: Tolerance, ignore: frozenset[str]
) -> tuple[bool, str, str | None, dict[str, Any]] | None:
    names = [n for n in a if n in b and n not in ignore and not VOLATILE.search(n)]
    if not names:
        return None
    bad = [n for n in names if not tol.close(a[n], b[n])]
    if not bad:
        return True, "", None, {}
    text = ", ".join(f"{n} {a[n]!r} vs {b[n]!r}" for n in bad[:4])
    return False, text, None, {"metrics": bad}


def _canary(a: Any, b: Any, tol: Tolerance) -> tuple[bool, str, str | None, dict[str, Any]]:
    if len(a) != len(b):
        return False, f"{len(a)} vs {len(b)} log-probs", None, {}
    for i, (x, y) in enumerate(zip(a, b)):
        if not tol.close(x, y):
            return False, f"log-prob {i}: {x!r} vs {y!r}", None, {"index": i}
    return True, "", None, {}
