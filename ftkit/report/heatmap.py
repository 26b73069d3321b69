"""The model behind the divergence heatmap of ``compare-dumps --html`` (rendered by ``ftkit.report.html``).

``heatmap(result)`` turns a ``CompareResult`` into rows, columns and cells. Rows are *layers*
in model order: the module path up to its index for megatron (``decoder.layers.3``), Hugging
Face (``encoder.layer.3``, ``model.layers.3``, ``transformer.h.3``) and similar names;
otherwise the tensor's module path (the name up to its capture kind, without trailing
parameter leaves: ``weight``, ``bias``, ``exp_avg`` ...), so a module's parameters,
activations and gradients share its row. Rows follow the forward pass (the order activations
are first captured; indexed rows together, sorted by index); rows never captured in forward
follow in capture order. Columns are capture groups (rollout / step / micro-shard, or a plain
file) in capture order. A cell keeps, per metric (``METRICS``), the largest value over its
tensors and the tensor that holds it, whether any failed and whether any is missing or of
another shape or dtype. A rollout or file missing whole on one side (CD006 / CD005: its tensors
were never paired) is a column of its own, after the compared ones, whose cells are all missing
(``broken``), so the picture shows what the findings say. Beyond ``MAX_COLS`` columns,
``MAX_HEAT_ROWS`` rows or ``MAX_CELLS`` cells, neighbours merge (the maximum kept, labels ``a .. b``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ftkit.dumps.compare import CompareResult, PairResult
from ftkit.dumps.layout import KINDS

METRICS = ("max_rel", "max_abs", "dissimilarity")
MAX_COLS, MAX_HEAT_ROWS, MAX_CELLS = 160, 400, 12_000
LAYER_RE = re.compile(r"^(?P<prefix>(?:.*?\.)?(?:layers|layer|h|blocks|block))\.(?P<index>\d+)(?:\.|#|$)")
_BAD_STATUS = ("shape", "dtype", "missing_in_a", "missing_in_b", "invalid")
_LEAVES = frozenset({"weight", "bias", "exp_avg", "exp_avg_sq", "step", "_extra_state"})  # per-parameter leaves
_FORWARD = frozenset({"input", "output"})
MISSING_ROW = "(not captured on both sides)"  # the one row when nothing at all was paired


def layer_of(name: str) -> str:
    """The heatmap row of a tensor name (see the module docstring)."""
    m = LAYER_RE.match(name)
    if m:
        return f"{m.group('prefix')}.{m.group('index')}"
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part in KINDS:
            parts = parts[:i]
            break
    while len(parts) > 1 and parts[-1] in _LEAVES:
        parts.pop()
    return ".".join(parts) or "(model)"


def _row_key(forward: dict[str, int], seen: dict[str, int]) -> Callable[[str], tuple[int, int, int, str]]:
    """Model order: rows (or their indexed prefix) by their first forward capture (activations
    run through the model in order), then rows never captured in forward by first capture."""

    def key(layer: str) -> tuple[int, int, int, str]:
        m = LAYER_RE.match(layer + ".")
        group, index = (m.group("prefix"), int(m.group("index"))) if m else (layer, -1)
        if group in forward:
            return (0, forward[group], index, layer)
        return (1, seen[group], index, layer)

    return key


@dataclass
class Cell:
    """The tensors of one (layer, capture group): the largest value per metric and its tensor."""

    values: list[float] = field(default_factory=lambda: [0.0] * len(METRICS))
    worst: list[PairResult | None] = field(default_factory=lambda: [None] * len(METRICS))
    tensors: int = 0
    failed: bool = False
    broken: bool = False
    first: bool = False

    def add(self, p: PairResult, first: bool) -> None:
        self.tensors += 1
        self.failed = self.failed or p.failed
        self.first = self.first or first
        if p.metrics is None:
            self.broken = self.broken or p.status in _BAD_STATUS
            return
        self.broken = self.broken or p.status in ("shape", "dtype")
        for i, metric in enumerate(METRICS):
            v = abs(float(getattr(p.metrics, metric)))
            if math.isnan(v):
                v = math.inf
            if v > self.values[i] or self.worst[i] is None:
                self.values[i], self.worst[i] = max(v, self.values[i]), p

    def merge(self, other: Cell) -> None:
        for i in range(len(METRICS)):
            if other.worst[i] is not None and (self.worst[i] is None or other.values[i] > self.values[i]):
                self.values[i], self.worst[i] = other.values[i], other.worst[i]
        self.tensors += other.tensors
        self.failed, self.broken = self.failed or other.failed, self.broken or other.broken
        self.first = self.first or other.first


@dataclass
class Heatmap:
    rows: list[str]
    cols: list[str]
    cells: dict[tuple[int, int], Cell]


def heatmap(result: CompareResult) -> Heatmap:
    """Rows (layers in model order), columns (capture groups in capture order) and the cells."""
    first = result.first_divergence
    cols: dict[str, int] = {}
    seen: dict[str, int] = {}
    forward: dict[str, int] = {}
    by_layer: dict[str, dict[int, Cell]] = {}
    for p in result.pairs:
        col = cols.setdefault(p.group, len(cols))
        layer = layer_of(p.name)
        m = LAYER_RE.match(layer + ".")
        group = m.group("prefix") if m else layer
        seen.setdefault(group, len(seen))
        if p.kind in _FORWARD:
            forward.setdefault(group, len(forward))
        by_layer.setdefault(layer, {}).setdefault(col, Cell()).add(p, p is first)
    rows = sorted(by_layer, key=_row_key(forward, seen)) or [MISSING_ROW]
    cells = {(r, c): cell for r, layer in enumerate(rows) for c, cell in by_layer.get(layer, {}).items()}
    for label in missing_wholes(result):
        col = cols.setdefault(label, len(cols))
        for r in range(len(rows)):
            cells[(r, col)] = Cell(failed=True, broken=True)
    hm = Heatmap(rows, list(cols), cells)
    return _shrink(hm, MAX_HEAT_ROWS, MAX_COLS)


def missing_wholes(result: CompareResult) -> list[str]:
    """Column labels of the rollouts (CD006) and files (CD005) one side lacks entirely."""
    labels = []
    for f in result.findings:
        what = f.evidence.get("rollout") if f.code == "CD006" else f.evidence.get("path") if f.code == "CD005" else None
        if what is not None:
            labels.append(f"{what} (missing in {f.evidence.get('missing_in')})")
    return labels


def _shrink(hm: Heatmap, max_rows: int, max_cols: int) -> Heatmap:
    """Merge neighbouring rows / columns so at most ``max_rows`` x ``max_cols`` remain."""
    fr = math.ceil(len(hm.rows) / max_rows) if len(hm.rows) > max_rows else 1
    cols = min(max_cols, max(MAX_CELLS // math.ceil(len(hm.rows) / fr), 1))  # and at most MAX_CELLS cells
    fc = math.ceil(len(hm.cols) / cols) if len(hm.cols) > cols else 1
    if fr == 1 and fc == 1:
        return hm

    def names(labels: list[str], f: int) -> list[str]:
        spans = [labels[i : i + f] for i in range(0, len(labels), f)]
        return [g[0] if len(g) == 1 else f"{g[0]} .. {g[-1]}" for g in spans]

    cells: dict[tuple[int, int], Cell] = {}
    for (r, c), cell in hm.cells.items():
        into = cells.setdefault((r // fr, c // fc), Cell())
        into.merge(cell)
    return Heatmap(names(hm.rows, fr), names(hm.cols, fc), cells)
