"""Names from inputs are printed literally and on one line in every command's human output
(issue 24 item 2): a tensor, file or run name holding a line feed and a GitHub workflow command,
Rich markup, an emoji code and an escape sequence cannot forge an annotation (a GitHub runner
reads every line of the plain log that starts with ``::``), restyle the report or reach the
terminal."""

from __future__ import annotations

import json

import pytest
import torch

from ftkit import cli
from ftkit.dumps.writer import DumpWriter
from ftkit.tensors.sharding import Sharding
from ftkit.testing.synthetic import generate
from ftkit.testing.synthetic_spec import SyntheticSpec

NAME = "evil\n::error file=a.py,line=1::forged\r\n::warning::two [bold]b[/bold] :warning: \x1b[31mred\t."
SHOWN = "evil\\n::error file=a.py,line=1::forged\\x0d\\n::warning::two [bold]b[/bold] :warning: \\x1b[31mred\\t."


def _assert_literal(text: str) -> None:
    forged = [line for line in text.splitlines() if line.lstrip(" │┃").startswith("::")]
    assert not forged, forged
    assert "\x1b" not in text and "\r" not in text and "\u26a0" not in text  # no escape, no CR, no emoji
    assert SHOWN in text  # literal: markup, emoji code and escapes shown as written, on one line


def _run(capsys, *args) -> tuple[int, str]:
    code = cli.main([*map(str, args)])
    out, err = capsys.readouterr()
    return code, out + err


@pytest.fixture
def dumps(tmp_path):
    torch.manual_seed(0)
    for side, delta in (("a", 0.0), ("b", 0.5)):
        dw = DumpWriter(tmp_path / side, "actor", "fwd_bwd", 0, "step000000-ms000-tp0-pp0", meta={"cell": 0, "rank": 0})
        dw.add(NAME, torch.ones(4, 8) + delta, step=0, micro_shard=0, sharding=Sharding.replicated())
        dw.write()
    return tmp_path


def test_compare_dumps_human_output(dumps, capsys) -> None:
    code, text = _run(capsys, "compare-dumps", dumps / "a", dumps / "b", "--exact")
    assert code == 1 and "First divergence" in text
    _assert_literal(text)


def test_dump_inspect_human_output(dumps, capsys) -> None:
    code, text = _run(capsys, "dump", dumps / "a")
    assert code == 0
    _assert_literal(text)


def test_analyze_events_human_output(tmp_path, capsys) -> None:
    """The run's name, as every line of the log spells it."""
    events = generate(tmp_path, SyntheticSpec(cells=2, engines=1, rollouts=1, steps_per_rollout=2)).events_dir
    for path in events.glob("*.jsonl"):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps({**ev, "run": NAME}) + "\n" for ev in lines))
    code, text = _run(capsys, "analyze-events", events)
    assert code in (0, 1) and "Run " in text
    _assert_literal(text)
