"""``ftkit compare-dumps``: exit codes, stdout formats, JUnit, HTML, usage and input errors."""

from __future__ import annotations

import json
import re
import shutil
import struct
import xml.etree.ElementTree as ET

import pytest
import torch

from ftkit import cli
from ftkit.dumps.writer import DumpWriter
from ftkit.tensors.sharding import Sharding


def _tree(root, values: dict[str, torch.Tensor], writer="step000000-ms000-tp0-pp0"):
    dw = DumpWriter(root, "actor", "fwd_bwd", 0, writer, meta={"cell": 0, "rank": 0})
    for name, t in values.items():
        dw.add(name, t, step=0, micro_shard=None if name.endswith(".param") else 0, sharding=Sharding.replicated())
    dw.write()
    return dw


@pytest.fixture
def trees(tmp_path):
    torch.manual_seed(0)
    base = {
        "decoder.layers.0.mlp.output": torch.randn(4, 8),
        "decoder.layers.1.mlp.output": torch.randn(4, 8),
        "decoder.layers.0.mlp.weight.param": torch.randn(8, 8),
    }
    changed = dict(base)
    changed["decoder.layers.1.mlp.output"] = base["decoder.layers.1.mlp.output"] + 0.25
    _tree(tmp_path / "a", base)
    _tree(tmp_path / "same", base)
    _tree(tmp_path / "b", changed)
    return tmp_path


def _run(capsys, *args):
    code = cli.main(["compare-dumps", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_equal_exits_0_with_a_human_report(trees, capsys):
    code, out, err = _run(capsys, trees / "a", trees / "same", "--exact")
    assert code == 0 and "PASS" in out and "3 tensors compared" in out and "Error" not in err


def test_difference_exits_1_and_json_is_pure_data(trees, capsys):
    code, out, err = _run(capsys, trees / "a", trees / "b", "--format", "json")
    assert code == 1
    doc = json.loads(out)  # stdout holds the JSON document and nothing else
    assert doc["schema_version"] == 1 and doc["command"] == "compare-dumps" and doc["verdict"] == "fail"
    assert doc["first_divergence"]["id"] == "actor/fwd_bwd/rollout_000000/step000000/ms000:decoder.layers.1.mlp.output"
    assert doc["first_divergence"]["metrics"]["max_abs"] == pytest.approx(0.25)
    assert [f["code"] for f in doc["findings"]] == ["CD001"]
    assert doc["stats"]["equal"] == 2 and doc["stats"]["differ"] == 1 and len(doc["tensors"]) == 3
    assert {r["code"] for r in doc["rules"]} >= {"CD001", "CD004", "CD007"}


def test_human_report_names_first_divergence_and_worst(trees, capsys):
    code, out, _ = _run(capsys, trees / "a", trees / "b", "--top", "1")
    assert code == 1
    assert "First divergence" in out and "decoder.layers.1.mlp.output" in out and "FAIL" in out
    assert "Worst 1" in out


def test_github_format_and_step_summary(trees, capsys, tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code, out, _ = _run(capsys, trees / "a", trees / "b", "--format", "github")
    lines = out.strip().splitlines()
    assert code == 1 and lines[0].startswith("::error title=CD001 value-mismatch::")
    assert lines[-1].startswith("::error title=ftkit compare-dumps::fail")
    assert "first divergence" in lines[-1] and "### ftkit compare-dumps: fail" in summary.read_text()


def test_junit_one_case_per_tensor(trees, capsys, tmp_path):
    xml = tmp_path / "r.xml"
    code, _, _ = _run(capsys, trees / "a", trees / "b", "--junit-xml", xml)
    suite = ET.parse(xml).getroot().find("testsuite")
    cases = suite.findall("testcase")
    assert code == 1 and suite.get("tests") == "3" and suite.get("failures") == "1" and len(cases) == 3
    failed = [c.get("name") for c in cases if c.find("failure") is not None]
    assert failed == ["actor/fwd_bwd/rollout_000000/step000000/ms000:decoder.layers.1.mlp.output"]


def test_html_report_is_self_contained(trees, capsys, tmp_path):
    html = tmp_path / "r.html"
    code, _, _ = _run(capsys, trees / "a", trees / "b", "--html", html, "--format", "json")
    text = html.read_text()
    assert code == 1 and text.startswith("<!DOCTYPE html>") and "<svg" in text and "</html>" in text
    assert "decoder.layers.1" in text and "First divergence" in text
    assert not re.search(r"""src\s*=|<link|https?://(?!www\.w3\.org/2000/svg)""", text)  # nothing fetched
    svg = ET.fromstring(re.search(r"<svg id='heat'.*?</svg>", text, re.S).group(0))  # well-formed inline SVG
    cells = [c for c in svg if c.tag.endswith("rect") and "c" in c.get("class", "").split()]
    assert len(cells) == 3  # layers 0 and 1 at micro-shard 0, layer 0 in the replicated (param) column
    data = json.loads(re.search(r"<script type='application/json' id='heat-data'>(.*?)</script>", text, re.S).group(1))
    assert len(data["cells"]) == len(cells)  # hover data, one entry per drawn cell in drawing order
    failing = {data["rows"][d[0]] for c, d in zip(cells, data["cells"]) if "f" in c.get("class", "").split()}
    assert failing == {"decoder.layers.1"}


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--exact", "--rtol", "1e-3"], "--exact cannot be combined"),
        (["--rtol", "-1"], "non-negative"),
        (["--rules", "RULES", "--atol", "1"], "--rules cannot be combined"),
        (["--rules", "NOPE"], "cannot read rules file"),
        (["--rules", "BADRULES"], "unknown name"),
    ],
)
def test_usage_and_config_errors_exit_2(trees, capsys, tmp_path, args, needle):
    (tmp_path / "rules.toml").write_text("[[rule]]\nmatch = '.'\nrequire = 'true'\n")
    (tmp_path / "bad.toml").write_text("[[rule]]\nmatch = '.'\nrequire = 'colour > 1'\n")
    args = [
        {"RULES": tmp_path / "rules.toml", "NOPE": tmp_path / "nope.toml", "BADRULES": tmp_path / "bad.toml"}.get(a, a)
        for a in args
    ]
    code, out, err = _run(capsys, trees / "a", trees / "b", *args)
    assert code == 2 and out == "" and err.startswith("Error: ") and needle in err and "Traceback" not in err


@pytest.mark.parametrize("corruption", ["truncated", "lying-header", "unsupported-dtype", "garbage"])
def test_corrupt_files_exit_2_never_3(trees, capsys, corruption):
    data = next((trees / "b").rglob("*.safetensors"))
    raw = data.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    key = next(k for k in header if k != "__metadata__")
    if corruption == "truncated":
        data.write_bytes(raw[: len(raw) // 2])
    elif corruption == "garbage":
        data.write_bytes(b"\xff" * 64)
    else:
        if corruption == "lying-header":
            header[key]["data_offsets"] = [0, 10**9]
        else:
            header[key]["dtype"] = "F128"
        h = json.dumps(header).encode()
        data.write_bytes(struct.pack("<Q", len(h)) + h + raw[8 + n :])
    code, out, err = _run(capsys, trees / "a", trees / "b")
    assert code == 2 and out == ""
    assert err.startswith(f"Error: malformed safetensors file {data}") and "Hint:" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 2


def test_fail_on_warning_makes_non_finite_values_fail(tmp_path, capsys):
    x = torch.tensor([1.0, float("nan")])
    _tree(tmp_path / "a", {"h.output": x})
    _tree(tmp_path / "b", {"h.output": x})
    code, out, _ = _run(capsys, tmp_path / "a", tmp_path / "b")
    assert code == 0 and "CD010" in out
    assert _run(capsys, tmp_path / "a", tmp_path / "b", "--fail-on", "warning")[0] == 1


def test_progress_goes_to_stderr_only(trees, capsys, monkeypatch):
    monkeypatch.setenv("FTKIT_PROGRESS", "1")
    code, out, _ = _run(capsys, trees / "a", trees / "same", "--format", "json")
    assert code == 0 and json.loads(out)["verdict"] == "pass"


def test_a_missing_side_is_reported_before_the_other_is_scanned(tmp_path, capsys):
    from ftkit.cli import main

    corrupt = tmp_path / "a"
    corrupt.mkdir()
    (corrupt / "x.safetensors").write_bytes(b"\x01")  # would be an error of its own if scanned first
    assert main(["compare-dumps", str(corrupt), str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.startswith(f"Error: {tmp_path / 'missing'} does not exist")


def test_compare_dumps_and_dump_never_import_torch(trees):
    """Start-up (issue 10): reading and comparing safetensors needs numpy only."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from ftkit import cli\n"
        "codes = [cli.main(['compare-dumps', sys.argv[1], sys.argv[2]]), cli.main(['dump', sys.argv[1]])]\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'megatron', 'ray', 'safetensors'})\n"
        "sys.stderr.write(f'RESULT {codes} {heavy}')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(trees / "a"), str(trees / "b")], capture_output=True, text=True, timeout=300
    )
    assert "RESULT [1, 0] []" in proc.stderr, proc.stderr[-2000:]


def _run_dir(root, seed, values):
    import json as _json

    root.mkdir(parents=True)
    config = {"model": "tiny", "micro_shards": 8, "samples_per_rollout": 64, "seed": seed, "cells": 2}
    (root / "run.json").write_text(_json.dumps({"schema": "ftkit.run/1", "config": config}))
    _tree(root / "dumps", values)
    return root


def test_every_format_puts_the_cause_first(tmp_path, capsys, monkeypatch):
    """Configs differ (CD012) and 30 tensors differ because of it: CD012 leads the JSON findings,
    the JUnit cases and the GitHub annotations (inside the budget) and the summary names it;
    the first divergence follows (issue 24 item 4)."""
    torch.manual_seed(0)
    base = {f"decoder.layers.{i}.mlp.output": torch.randn(4, 8) for i in range(30)}
    a = _run_dir(tmp_path / "a", 0, base)
    b = _run_dir(tmp_path / "b", 1, {k: v + 1 for k, v in base.items()})
    code, out, _ = _run(capsys, a, b, "--exact", "--format", "json")
    doc = json.loads(out)
    first = doc["first_divergence"]["id"]
    assert code == 1 and [f["code"] for f in doc["findings"][:2]] == ["CD012", "CD001"]
    assert doc["findings"][1]["evidence"]["tensor"] == first
    summary, junit = tmp_path / "summary.md", tmp_path / "r.xml"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code, out, _ = _run(capsys, a, b, "--exact", "--format", "github", "--junit-xml", junit)
    lines = out.strip().splitlines()
    assert lines[0].startswith("::error title=CD012 config-mismatch::") and first.split(":")[-1] in lines[1]
    assert "more finding(s) not annotated" in lines[-2] and "configs differ (seed; CD012)" in lines[-1]
    md = summary.read_text()
    assert md.index("configs differ") < md.index("| tensors |") < md.index("First divergence")
    cases = ET.parse(junit).getroot().findall("testsuite/testcase")
    assert cases[0].find("failure").get("message").startswith("CD012") and cases[1].get("name") == first


def test_kinds_that_cannot_be_compared_are_named_in_words(trees, tmp_path, capsys):
    plain = tmp_path / "plain"
    plain.mkdir()
    shutil.copy(next((trees / "a").rglob("*.safetensors")), plain / "x.safetensors")
    code, _, err = _run(capsys, trees / "a", plain)
    assert code == 2 and "cannot compare a dump directory (" in err and "with a directory of .safetensors files" in err
