"""The comparator behind ``ftkit compare-dumps``: pair, stream, measure, decide, report findings.

``compare_paths(a, b, options)`` opens both sources (``ftkit.dumps.sources``), pairs their
tensors in capture order (``ftkit.dumps.pairing``) and compares item by item, so only one
item's tensors are in memory at a time. Per item:

1. each side is resolved (``ftkit.dumps.sides``): loaded lazily, fingerprinted, verified
   against its index, copies checked (CD007), TP shards checked (CD008);
2. dtype (CD003) and full shape (CD002) must match;
3. equal fingerprint signatures prove bitwise equality (only NaN/Inf counts are computed);
   otherwise the shards are assembled and ``diff_metrics`` runs;
4. the mode decides (CD001): ``exact`` fails on any differing bit, ``tolerance`` on any element
   outside ``atol + rtol·|b|`` (NaN positions must match), ``rules`` on the first matching
   rule's predicate, and on tensors no rule covers (CD009).

Missing rollouts (CD006), files (CD005) and tensors (CD004, grouped per micro-shard or file)
are findings: evidence that is absent never passes. ``first_divergence`` is the earliest
failing item in capture order.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ftkit.dumps.codes import finding, summaries
from ftkit.dumps.layout import DUMP_SCHEME
from ftkit.dumps.loader import TensorLoader, check_fingerprint
from ftkit.dumps.metrics import Metrics, diff_metrics, nonfinite_counts
from ftkit.dumps.pairing import Item, pair, rollout_label
from ftkit.dumps.rollout_set import dumps_rollout
from ftkit.dumps.rules import RuleSet
from ftkit.dumps.sides import SideValue, load_pieces, resolve_side
from ftkit.dumps.sources import check_compatible, config_diff, open_source, require_exists
from ftkit.errors import UsageError
from ftkit.findings import Finding, RuleSummary
from ftkit.tensors.fingerprint import fingerprint_hasher

FAILING = ("differ", "shape", "dtype", "missing_in_a", "missing_in_b", "invalid", "uncovered")


@dataclass
class CompareOptions:
    mode: str = "tolerance"  # "tolerance" | "exact" | "rules"
    rtol: float = 1e-5
    atol: float = 1e-8
    rules: RuleSet | None = None

    def tolerances(self) -> tuple[float, float]:
        """``(rtol, atol)`` the metrics use: zero under ``--exact`` (``tol_fail`` then counts
        every numeric difference, and no tolerance arithmetic is done)."""
        return (0.0, 0.0) if self.mode == "exact" else (self.rtol, self.atol)

    def describe(self) -> str:
        if self.mode == "exact":
            return "exact (bitwise)"
        if self.mode == "rules":
            return f"rules from {self.rules.path if self.rules else '?'}"
        return f"tolerance rtol={self.rtol:g} atol={self.atol:g}"


@dataclass
class PairResult:
    id: str
    group: str
    name: str
    kind: str
    status: str  # equal | close | differ | shape | dtype | missing_in_a | missing_in_b | invalid | uncovered
    message: str = ""
    metrics: Metrics | None = None
    dtype: tuple[str | None, str | None] = (None, None)
    shape: tuple[list[int] | None, list[int] | None] = (None, None)
    origins: tuple[list[str], list[str]] = ([], [])
    rule: str | None = None
    seconds: float | None = None  # what loading and comparing the pair took (not in the JSON: not a result)

    @property
    def failed(self) -> bool:
        return self.status in FAILING

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "group": self.group,
            "name": self.name,
            "kind": self.kind,
            "status": self.status,
            "message": self.message,
            "dtype_a": self.dtype[0],
            "dtype_b": self.dtype[1],
            "shape_a": self.shape[0],
            "shape_b": self.shape[1],
            "origins_a": self.origins[0],
            "origins_b": self.origins[1],
            "rule": self.rule,
            "metrics": self.metrics.to_dict() if self.metrics else None,
        }


@dataclass
class CompareResult:
    a: Path
    b: Path
    kind: str
    options: CompareOptions
    pairs: list[PairResult] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    rules: list[RuleSummary] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # special files in the trees, not read
    config_diff: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # data-shaping run.json fields

    @property
    def first_divergence(self) -> PairResult | None:
        return next((p for p in self.pairs if p.failed), None)


def compare_paths(
    a: str | Path,
    b: str | Path,
    options: CompareOptions,
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    follow_symlinks: bool = False,
) -> CompareResult:
    """Compare two run directories, dump directories, directories of safetensors or files.

    ``on_start(total_bytes)`` is called once the work is known; ``progress(nbytes)`` after
    each item. Raises ``InputError``/``UsageError`` for unreadable or incompatible input
    (symlinks leaving a tree too, unless ``follow_symlinks``). Two runs whose ``run.json``
    differ in a field that shapes the data get a CD012 finding first.
    """
    require_exists(a), require_exists(b)  # both before either is scanned (a scan can be long)
    if Path(a).resolve() == Path(b).resolve():
        raise UsageError(
            f"A and B are the same tree ({Path(a).resolve()}): comparing it with itself proves nothing",
            "pass two different runs, dump directories or files",
        )
    sa, sb = open_source(a, follow_symlinks), open_source(b, follow_symlinks)
    check_compatible(sa, sb)
    pairing = pair(sa, sb)
    result = CompareResult(Path(a), Path(b), sa.kind, options, skipped=sa.skipped + sb.skipped)
    if on_start:
        on_start(sum(i.nbytes for i in pairing.items))
    result.config_diff = config_diff(sa.config, sb.config)
    if result.config_diff:
        shown = "; ".join(f"{k}: {va!r} in A, {vb!r} in B" for k, va, vb in _diff_rows(result.config_diff))
        result.findings.append(
            finding(
                "CD012",
                f"the runs differ in what shapes their data ({shown}); tensor findings below follow from it",
                fields={k: {"a": va, "b": vb} for k, va, vb in _diff_rows(result.config_diff)},
            )
        )
    for side, src in (("A", sa), ("B", sb)):
        if src.config_missing:
            result.findings.append(
                finding(
                    "CD014",
                    f"{side} ({src.root}) {src.config_missing}: whether the two runs shape their data alike "
                    "(the CD012 check) could not be made",
                    side=side,
                    path=str(src.root / "run.json"),
                )
            )
    missing = 0
    for key, lacking in pairing.missing_rollouts:
        label = rollout_label(*key)
        if _outside_dump_sets(key[2], sa.config, sb.config):
            result.findings.append(
                finding(
                    "CD013",
                    f"rollout {label} exists only in {'B' if lacking == 'A' else 'A'}, outside both runs' final "
                    "dump sets (an earlier session's last rollout, before --resume extended the run): not compared",
                    rollout=label,
                    missing_in=lacking,
                )
            )
            continue
        missing += 1
        result.findings.append(
            finding("CD006", f"rollout {label} is missing in {lacking}", rollout=label, missing_in=lacking)
        )
    for rel, lacking in pairing.missing_files:
        result.findings.append(finding("CD005", f"file {rel} is missing in {lacking}", path=rel, missing_in=lacking))
    for side, src in (("A", sa), ("B", sb)):
        for rel in src.orphans:
            result.findings.append(
                finding(
                    "CD011",
                    f"{side}: {rel} has no index (interrupted write?); not compared",
                    path=str(src.root / rel),
                    side=side,
                )
            )
    loader = TensorLoader()
    try:
        for item in pairing.items:
            t0 = time.perf_counter()
            pr, found = _compare_item(item, options, loader)
            pr.seconds = time.perf_counter() - t0  # its JUnit case's time
            loader.release([p.ref for p in item.a + item.b])  # resident memory: one item at a time
            result.pairs.append(pr)
            result.findings.extend(found)
            if progress:
                progress(item.nbytes)
    finally:
        loader.close()
    result.findings.extend(_missing_findings(result.pairs))
    result.stats = _stats(result, sa.total_bytes() + sb.total_bytes(), missing, len(pairing.missing_files))
    compared = sum(1 for p in result.pairs if p.metrics is not None)
    result.rules = summaries(
        {
            "CD001": compared,
            "CD002": compared,
            "CD003": compared,
            "CD004": len(result.pairs),
            "CD005": len(sa.files.keys() | sb.files.keys()),
            "CD006": len(sa.rollouts | sb.rollouts),
            "CD007": len(result.pairs),
            "CD008": len(result.pairs),
            "CD009": len(result.pairs) if options.mode == "rules" else 0,
            "CD010": compared,
            "CD011": len(sa.orphans) + len(sb.orphans),
            "CD012": int(sa.config is not None and sb.config is not None),
            "CD014": int(sa.kind == "run") * 2,
        },
        result.findings,
    )
    return result


def _compare_item(item: Item, opt: CompareOptions, loader: TensorLoader) -> tuple[PairResult, list[Finding]]:
    pr = PairResult(
        item.id,
        item.group,
        item.name,
        item.kind,
        "equal",
        origins=(sorted({p.origin for p in item.a}), sorted({p.origin for p in item.b})),
    )
    if not item.a or not item.b:
        pr.status = "missing_in_a" if not item.a else "missing_in_b"
        pr.message = f"missing in {'A' if not item.a else 'B'}"
        return pr, []
    fused = _fused_pass(item, opt, loader)
    tensors, fps = fused[:2] if fused else load_pieces(item.a + item.b, loader)
    n = len(item.a)
    va, fa = resolve_side(item.id, "A", item.a, tensors[:n], fps[:n])
    vb, fb = resolve_side(item.id, "B", item.b, tensors[n:], fps[n:])
    found = fa + fb
    if va is None or vb is None:
        pr.status, pr.message = "invalid", "; ".join(f.message for f in found if f.code == "CD008")
        return pr, found
    pr.dtype, pr.shape = (va.dtype, vb.dtype), (list(va.shape), list(vb.shape))
    if va.shape != vb.shape:
        pr.status, pr.message = "shape", f"shape {list(va.shape)} in A, {list(vb.shape)} in B"
        return pr, found + [
            finding("CD002", f"{item.id}: {pr.message}", tensor=item.id, shape_a=list(va.shape), shape_b=list(vb.shape))
        ]
    pr.metrics = fused[2] if fused else _metrics(va, vb, opt)
    if va.dtype != vb.dtype:
        pr.status, pr.message = "dtype", f"dtype {va.dtype} in A, {vb.dtype} in B"
        return pr, found + [
            finding(
                "CD003",
                f"{item.id}: {pr.message}",
                tensor=item.id,
                dtype_a=va.dtype,
                dtype_b=vb.dtype,
                **pr.metrics.brief(),
            )
        ]
    found += _decide(pr, opt)
    if not pr.failed and pr.metrics.nonfinite:
        m = pr.metrics
        found.append(
            finding(
                "CD010",
                f"{item.id}: holds non-finite values (NaN {m.nan_a}, Inf {m.inf_a})",
                tensor=item.id,
                nan=m.nan_a,
                inf=m.inf_a,
            )
        )
    return pr, found


def _diff_rows(diff: dict[str, tuple[Any, Any]]) -> list[tuple[str, Any, Any]]:
    return [(k, va, vb) for k, (va, vb) in diff.items()]


def _fused_pass(
    item: Item, opt: CompareOptions, loader: TensorLoader
) -> tuple[list[np.ndarray], list[str], Metrics] | None:
    """For one stored tensor per side whose index fingerprints differ (and shapes agree):
    measure and fingerprint in one pass over the data, then verify the fingerprints against
    the index (``InputError`` on a mismatch). ``None`` when the item needs the general path."""
    if len(item.a) != 1 or len(item.b) != 1:
        return None
    pa, pb = item.a[0], item.b[0]
    if (
        pa.sharding.is_split
        or pb.sharding.is_split
        or pa.ref.fingerprint is None
        or pb.ref.fingerprint is None
        or pa.ref.fingerprint == pb.ref.fingerprint
        or pa.ref.info.shape != pb.ref.info.shape
    ):
        return None
    arrays = [loader.load(pa.ref), loader.load(pb.ref)]
    hashers = [fingerprint_hasher(p.ref.info.dtype, p.ref.info.shape, DUMP_SCHEME) for p in (pa, pb)]
    metrics = diff_metrics(arrays[0], arrays[1], *opt.tolerances(), hashers)
    fps = [h.hexdigest() for h in hashers]
    for p, fp in zip((pa, pb), fps):
        check_fingerprint(p.ref, fp)
    return arrays, fps, metrics


def _metrics(va: SideValue, vb: SideValue, opt: CompareOptions) -> Metrics:
    if va.signature == vb.signature:  # bitwise equal: only the non-finite counts are left
        nan = inf = 0
        for (_, t), known in zip(va.chosen, va.counts):
            n, i = known if known is not None else nonfinite_counts(t)  # index counts: data verified
            nan, inf = nan + n, inf + i
        return Metrics(va.numel, True, nan_a=nan, nan_b=nan, inf_a=inf, inf_b=inf)
    return diff_metrics(va.full(), vb.full(), *opt.tolerances())  # (same bits in another TP layout: equal)


def _decide(pr: PairResult, opt: CompareOptions) -> list[Finding]:
    m = pr.metrics
    assert m is not None
    if opt.mode == "rules":
        rule = opt.rules.rule_for(pr.id) if opt.rules else None
        if rule is None:
            pr.status, pr.message = "uncovered", "no rule covers this tensor"
            return [finding("CD009", f"{pr.id}: no --rules entry matches it", tensor=pr.id)]
        pr.rule = rule.name
        ok = rule.passes(m.to_dict())
        why = f"fails rule '{rule.name}' ({rule.require})"
    elif opt.mode == "exact":
        ok = m.bitwise_equal
        why = f"bits differ in {m.bits_differ} of {m.numel} elements"
    else:
        ok = m.tol_fail == 0
        why = f"{m.tol_fail} of {m.numel} elements outside rtol={opt.rtol:g} atol={opt.atol:g}"
    if ok:
        pr.status = "equal" if m.bitwise_equal else "close"
        return []
    pr.status = "differ"
    pr.message = f"{why}; {m.summary()}"
    return [finding("CD001", f"{pr.id}: {pr.message}", tensor=pr.id, rule=pr.rule, **m.brief())]


def _missing_findings(pairs: list[PairResult]) -> list[Finding]:
    """One CD004 finding per (group, side) listing the tensors missing there."""
    groups: dict[tuple[str, str], list[str]] = {}
    for p in pairs:
        if p.status in ("missing_in_a", "missing_in_b"):
            groups.setdefault((p.group, p.status[-1].upper()), []).append(p.name)
    out = []
    for (group, side), names in groups.items():
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        out.append(
            finding(
                "CD004",
                f"{group}: {len(names)} tensor(s) missing in {side}: {shown}",
                group=group,
                missing_in=side,
                count=len(names),
                tensors=names[:50],
            )
        )
    return out


def _outside_dump_sets(rollout: int, a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether neither run's final config (``run.json``) dumps ``rollout``: a dump of it on one
    side is left over from an earlier session (the last rollout before ``--resume --rollouts N``
    extended the run), not evidence the other side lacks. Unknown configs: False (CD006)."""
    for config in (a, b):
        if config is None:
            return False
        spec, rollouts = config.get("dump_rollouts"), config.get("rollouts")
        if not isinstance(spec, str) or type(rollouts) is not int:
            return False
        try:
            if dumps_rollout(spec, rollouts, rollout):
                return False
        except ValueError:
            return False
    return True


def _stats(result: CompareResult, total_bytes: int, missing_rollouts: int, missing_files: int) -> dict[str, int]:
    counts: dict[str, int] = {}
    for p in result.pairs:
        counts[p.status] = counts.get(p.status, 0) + 1
    return {
        "tensors": len(result.pairs),
        "bytes": total_bytes,
        "missing_rollouts": missing_rollouts,
        "missing_files": missing_files,
        **{
            s: counts.get(s, 0)
            for s in (
                "equal",
                "close",
                "differ",
                "shape",
                "dtype",
                "missing_in_a",
                "missing_in_b",
                "invalid",
                "uncovered",
            )
        },
    }
