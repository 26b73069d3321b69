"""``ftkit compare-dumps --html``: the divergence heatmap (``ftkit.report.heatmap``, ``ftkit.report.html``)
on real dumps."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from ftkit import cli
from ftkit.dumps.compare import CompareOptions, compare_paths
from ftkit.dumps.writer import DumpWriter
from ftkit.findings import Finding, Severity
from ftkit.report import heatmap as heat
from ftkit.report.heatmap import heatmap, layer_of
from ftkit.report.html import render_html
from ftkit.report.html_page import MAX_ROWS
from ftkit.tensors.sharding import Sharding
from ftkit.tensors.st import write_safetensors_atomic

SVG = "{http://www.w3.org/2000/svg}"
LAYERS = 4


def _names(style: str) -> list[str]:
    if style == "hf":
        body = [f"model.layers.{i}.{t}" for i in range(LAYERS) for t in ("self_attn.output", "mlp.output")]
        return ["model.embed_tokens.output", *body, "lm_head.output"]
    body = [f"decoder.layers.{i}.{t}" for i in range(LAYERS) for t in ("self_attention.output", "mlp.output")]
    return ["embedding.output", *body, "output_layer.output"]


def write_run(root: Path, *, diverge_at: tuple[int, int] | None, style: str = "megatron", cells: int = 1) -> None:
    """2 rollouts x 2 steps x 2 micro-shards; from (step, micro-shard) ``diverge_at`` on, layer 2
    and everything after it carry a small perturbation."""
    names = _names(style)
    for rollout in range(2):
        for k in range(2):
            step = rollout * 2 + k
            for ms in range(2):
                dw = DumpWriter(
                    root / "dumps", "actor", "fwd_bwd", rollout, f"step{step:06d}-ms{ms:03d}-tp0-pp0", meta={"cell": 0}
                )
                g = torch.Generator().manual_seed(100 * step + ms)
                for i, name in enumerate(names):
                    t = torch.randn(8, 16, generator=g)
                    if diverge_at is not None and (step, ms) >= diverge_at and i >= 5:
                        t = t * (1 + 1e-4 * i)
                    dw.add(name, t, step=step, micro_shard=ms, sharding=Sharding.replicated())
                dw.write()
    doc = {"schema": "ftkit.run/1", "run": root.name, "created": 1.0, "config": {"cells": cells, "seed": 0}}
    (root / "run.json").write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("runs")
    write_run(d / "a", diverge_at=None)
    write_run(d / "b", diverge_at=(2, 1), cells=2)
    write_run(d / "hf_a", diverge_at=None, style="hf")
    write_run(d / "hf_b", diverge_at=(0, 0), style="hf")
    return d


@pytest.mark.parametrize(
    "name,layer",
    [
        ("decoder.layers.11.mlp.linear_fc1.output", "decoder.layers.11"),
        ("encoder.layer.3.attention.self.query.weight", "encoder.layer.3"),
        ("model.layers.7.self_attn.q_proj.weight", "model.layers.7"),
        ("transformer.h.2.attn.c_attn.bias", "transformer.h.2"),
        ("decoder.final_layernorm.output", "decoder.final_layernorm"),
        ("embedding.word_embeddings.weight", "embedding.word_embeddings"),
        ("embedding.word_embeddings.weight.param", "embedding.word_embeddings"),  # shares the activation's row
        ("embedding.word_embeddings.output", "embedding.word_embeddings"),
        ("optimizer.decoder.final_layernorm.bias.exp_avg_sq", "optimizer.decoder.final_layernorm"),
        ("output", "(model)"),
        ("tokens", "tokens"),
    ],
)
def test_layer_grouping(name: str, layer: str) -> None:
    assert layer_of(name) == layer


def test_rows_in_model_order_columns_in_capture_order(runs: Path) -> None:
    result = compare_paths(runs / "a", runs / "b", CompareOptions())
    hm = heatmap(result)
    assert hm.rows == ["embedding", *[f"decoder.layers.{i}" for i in range(LAYERS)], "output_layer"]
    steps = [(s, m) for s in range(4) for m in range(2)]
    assert hm.cols == [f"actor/fwd_bwd/rollout_{s // 2:06d}/step{s:06d}/ms{m:03d}" for s, m in steps]
    failing = {(hm.rows[r], c) for (r, c), cell in hm.cells.items() if cell.failed}
    late = [c for c, sm in enumerate(steps) if sm >= (2, 1)]
    assert failing == {(row, c) for row in hm.rows[3:] for c in late}  # layer 2 (row 3) and after
    firsts = [(hm.rows[r], c) for (r, c), cell in hm.cells.items() if cell.first]
    assert firsts == [("decoder.layers.2", late[0])]
    cell = hm.cells[(hm.rows.index("output_layer"), late[-1])]
    assert cell.values[0] > 0 and cell.worst[0] is not None and cell.worst[0].name == "output_layer.output"


def test_hugging_face_names_group_by_layer(runs: Path) -> None:
    hm = heatmap(compare_paths(runs / "hf_a", runs / "hf_b", CompareOptions()))
    assert hm.rows == ["model.embed_tokens", *[f"model.layers.{i}" for i in range(LAYERS)], "lm_head"]


def test_many_columns_and_rows_are_merged(runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heat, "MAX_COLS", 3)
    monkeypatch.setattr(heat, "MAX_HEAT_ROWS", 4)
    hm = heatmap(compare_paths(runs / "a", runs / "b", CompareOptions()))
    assert len(hm.cols) == 3 and len(hm.rows) == 3 and " .. " in hm.cols[0]
    assert sum(c.tensors for c in hm.cells.values()) == 8 * (2 + 2 * LAYERS)


def test_page_has_config_diff_heatmap_and_first_divergence(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "cd.html"
    code = cli.main(["compare-dumps", str(runs / "a"), str(runs / "b"), "--html", str(page), "--format", "json"])
    capsys.readouterr()
    text = page.read_text()
    assert code == 1 and not re.search(r"src\s*=|<link|https?://(?!www\.w3\.org/2000/svg)", text)
    diff = re.search(r"Configuration differences.*?</table>", text, re.S).group(0)
    assert "config.cells" in diff and "created" not in diff
    svg = ET.fromstring(re.search(r"<svg id='heat'.*?</svg>", text, re.S).group(0))
    assert svg.find(f"{SVG}rect[@id='first-divergence']") is not None
    labels = [t.text for t in svg.iter(f"{SVG}text")]
    assert "r1 s3 ms1" in labels and "decoder.layers.3" in labels
    data = json.loads(re.search(r"id='heat-data'>(.*?)</script>", text, re.S).group(1))
    cells = [r for r in svg.iter(f"{SVG}rect") if "c" in (r.get("class") or "").split()]
    assert len(cells) == len(data["cells"]) == 6 * 8
    col = data["cols"].index("actor/fwd_bwd/rollout_000001/step000003/ms001")
    r, c, values, tensors, worst, status, element = next(
        d for d in data["cells"] if data["rows"][d[0]] == "output_layer" and d[1] == col
    )
    assert tensors == 1 and worst == "output" and status == "differ" and values[0] > 0
    assert re.fullmatch(r"\[\d+, \d+\]: A=\S+ B=\S+", element)  # worst element and both values
    assert all(len(d[2]) == 3 for d in data["cells"])  # one value per metric


def test_long_finding_lists_are_collapsed_and_capped(runs: Path) -> None:
    result = compare_paths(runs / "a", runs / "b", CompareOptions())
    result.findings = [
        Finding(
            code="CD001", rule="tensor-differs", severity=Severity.error, message=f"tensor {i} differs " + "x" * 200
        )
        for i in range(5000)
    ]
    text = render_html(result, "fail", None)
    block = re.search(r"<details>.*?</details>", text[text.index("<h2>Findings</h2>") :], re.S).group(0)
    assert "data-filter='findings'" in block and block.count("<tr>") == 1 + MAX_ROWS
    assert f"{5000 - MAX_ROWS} more finding(s)" in block and len(text) < 500_000


def test_bad_html_target_is_exit_2_before_comparing(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["compare-dumps", str(runs / "a"), str(runs / "b"), "--html", str(tmp_path / "no" / "x.html")])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.startswith("Error:") and "x.html" in err and "Hint:" in err


def test_rows_follow_the_forward_pass(tmp_path: Path) -> None:
    """Parameters are captured before activations (and here in the opposite order); rows follow
    the forward pass, and a module's parameters share its activation's row."""
    for side in ("a", "b"):
        dw = DumpWriter(tmp_path / side / "dumps", "actor", "fwd_bwd", 0, "w", meta={"cell": 0})
        for name in ("head.weight.param", "stem.weight.param", "stem.output", "head.output", "output"):
            ms = None if name.endswith(".param") else 0
            dw.add(name, torch.ones(2), step=0, micro_shard=ms, sharding=Sharding.replicated())
        dw.write()
    hm = heatmap(compare_paths(tmp_path / "a", tmp_path / "b", CompareOptions()))
    assert hm.rows == ["stem", "head", "(model)"]
    assert hm.cols == ["actor/fwd_bwd/rollout_000000/step000000", "actor/fwd_bwd/rollout_000000/step000000/ms000"]


def test_missing_rollouts_and_files_are_black_columns(runs: Path, tmp_path: Path) -> None:
    """Issue 24 item 7: what one side lacks whole (a rollout, CD006; a file, CD005) is drawn
    as the legend promises (every cell of its column missing), not left out of the picture."""
    import shutil

    short = tmp_path / "short"
    shutil.copytree(runs / "a", short)
    shutil.rmtree(short / "dumps" / "actor" / "fwd_bwd" / "rollout_000001")
    hm = heatmap(compare_paths(runs / "a", short, CompareOptions()))
    label = "actor/fwd_bwd/rollout_000001 (missing in B)"
    assert hm.cols[-1] == label and len(hm.cols) == 5
    col = hm.cols.index(label)
    assert all(hm.cells[(r, col)].broken and hm.cells[(r, col)].failed for r in range(len(hm.rows)))

    files_a, files_b = tmp_path / "fa", tmp_path / "fb"
    for d in (files_a, files_b):
        d.mkdir()
        write_safetensors_atomic(d / "x.safetensors", {"w": torch.ones(3)})
    write_safetensors_atomic(files_a / "y.safetensors", {"w": torch.ones(3)})
    result = compare_paths(files_a, files_b, CompareOptions())
    hm = heatmap(result)
    assert hm.cols == ["x.safetensors", "y.safetensors (missing in B)"] and hm.cells[(0, 1)].broken
    text = render_html(result, "fail", None)
    assert "not in B<title>y.safetensors (missing in B)</title>" in text
    short_page = render_html(compare_paths(runs / "a", short, CompareOptions()), "fail", None)
    assert ">r1 not in B<title>" in short_page
