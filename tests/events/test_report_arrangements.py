"""Every output of ``analyze-events`` -- human, JSON, GitHub, JUnit and the ``--html`` timeline --
of any arrangement of a run's lines (one ``cat``'d file, shuffled, split, gzipped) is the output
of its per-process files, apart from where the input lies (issue 24 item 1).

What may differ is only what names the input: file paths and line numbers (``where`` links,
``file``/``line`` fields) and how many files were read (``stats.files``, ``read_as``, "in N
files"), and JUnit's ``time`` attributes (the seconds the rules took). ``normalised`` removes
exactly those; everything else must be equal byte for byte.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from logsplit import log_lines, write_arrangement

from ftkit import cli
from ftkit.testing.synthetic import generate
from ftkit.testing.synthetic_spec import SyntheticSpec

_PATH = re.compile(r"(?:/[^\s'\"<>]*/)?[\w.-]+\.jsonl(?:\.gz)?(?::\d+)?")
_LINE = re.compile(r"\bline: \d+")  # JUnit's evidence lines
_FILES = re.compile(r"\b\d+ file(?:s|\(s\))?\b")
_BOX = re.compile(r"[\s\u2500-\u257f]+")  # Rich's table borders and padding: their width follows the paths
_LINK = re.compile(r"<a [^>]*>[^<]*</a>")
_TIME = re.compile(r' time="[0-9.]+"')  # JUnit: the seconds each rule and the suite took


def _drop_where(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_where(v) for k, v in value.items() if k not in ("file", "line")}
    if isinstance(value, list):
        return [_drop_where(v) for v in value]
    return value


def normalised(outputs: dict[str, str]) -> dict[str, Any]:
    """``outputs`` without what names the input (see the module docstring)."""
    doc = _drop_where(json.loads(outputs["json"]))
    for key in ("files", "read_as"):
        doc["stats"].pop(key)
    out: dict[str, Any] = {"json": doc, "code": outputs["code"]}
    for fmt in ("human", "github", "junit", "html"):
        text = _FILES.sub("N files", _LINE.sub("line: N", _PATH.sub("<input>", _LINK.sub("<where>", outputs[fmt]))))
        out[fmt] = _BOX.sub(" ", text) if fmt == "human" else _TIME.sub(' time="T"', text) if fmt == "junit" else text
    return out


def outputs(paths: list[Path], work: Path) -> dict[str, str]:
    """stdout of each ``--format``, the JUnit XML and the HTML page of ``analyze-events paths``."""
    res: dict[str, str] = {}
    for fmt in ("human", "json", "github"):
        junit, html = work / f"{fmt}.xml", work / f"{fmt}.html"
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
            code = cli.main(
                ["analyze-events", *map(str, paths), "--format", fmt, "--junit-xml", str(junit), "--html", str(html)]
            )
        res[fmt], res["code"] = buf.getvalue(), str(code)
    res["junit"], res["html"] = junit.read_text(), html.read_text()
    return res


def _reference(events: Path, work: Path) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    return normalised(outputs([events], work))


def _cat(events: Path, out: Path) -> Path:
    out.write_bytes(b"".join(p.read_bytes() for p in sorted(events.glob("*.jsonl"))))
    return out


SPEC = SyntheticSpec(
    cells=3, engines=2, rollouts=3, steps_per_rollout=4, samples_per_rollout=8, faults=2, tensors=6, seed=3
)
PLANTED = (None, "FT104", "FT106", "FT111")


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> dict[str | None, tuple[Path, dict[str, Any]]]:
    runs: dict[str | None, tuple[Path, dict[str, Any]]] = {}
    for code in PLANTED:
        d = tmp_path_factory.mktemp(f"synthetic-{code}")
        events = generate(d, dataclasses.replace(SPEC, violation=code)).events_dir
        runs[code] = (events, _reference(events, d / "ref"))
    return runs


def test_synthetic_references_show_faults_heals_and_the_plants(synthetic) -> None:
    html = synthetic[None][1]["html"]
    assert "mark-fault" in html and "mark-heal" in html and synthetic[None][1]["code"] == "0"
    for code in PLANTED[1:]:
        assert synthetic[code][1]["code"] == "1" and code in synthetic[code][1]["github"]


def test_synthetic_cat_is_the_per_process_report(synthetic, tmp_path: Path) -> None:
    for code, (events, reference) in synthetic.items():
        cat = _cat(events, tmp_path / f"cat-{code}.jsonl")
        assert normalised(outputs([cat], tmp_path)) == reference, code


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(plant=st.sampled_from(PLANTED), seed=st.integers(0, 2**32), parts=st.integers(1, 4), gz=st.booleans())
def test_synthetic_any_permutation_and_split(synthetic, plant, seed, parts, gz) -> None:
    events, reference = synthetic[plant]
    with tempfile.TemporaryDirectory() as d:
        files = write_arrangement(log_lines(events), Path(d) / "in", seed, parts, gz)
        assert normalised(outputs(files, Path(d))) == reference


@pytest.mark.slow
@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**32), parts=st.integers(1, 4), gz=st.booleans())
def test_real_run_any_permutation_split_and_cat(real_run: Path, seed, parts, gz) -> None:
    """The quickstart path: a real ``ftkit train`` log, per-process vs rearranged."""
    with tempfile.TemporaryDirectory() as d:
        reference = _reference(real_run, Path(d) / "ref")
        assert "reward" in reference["html"] and "state-alive" in reference["html"]
        assert normalised(outputs([_cat(real_run, Path(d) / "cat.jsonl")], Path(d))) == reference
        files = write_arrangement(log_lines(real_run), Path(d) / "in", seed, parts, gz)
        assert normalised(outputs(files, Path(d))) == reference
