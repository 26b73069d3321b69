"""The shipped arithmetic dataset: exactly what its generator writes, readable, answers right."""

import subprocess
import sys
from pathlib import Path

from ftkit.tasks.builtin_rewards import exact_match
from ftkit.tasks.datasets import arithmetic_path
from ftkit.tasks.jsonl import JsonlPrompts
from ftkit.tasks.rewards import load_reward

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "scripts" / "make_arithmetic_dataset.py")


def test_regenerating_gives_the_shipped_bytes(tmp_path):
    out = tmp_path / "a.jsonl"
    subprocess.run([sys.executable, SCRIPT, "--out", str(out)], check=True)
    assert out.read_bytes() == arithmetic_path().read_bytes()


def test_another_seed_gives_other_problems(tmp_path):
    out = tmp_path / "b.jsonl"
    subprocess.run([sys.executable, SCRIPT, "--out", str(out), "--count", "50", "--seed", "1"], check=True)
    lines = out.read_bytes().splitlines()
    assert len(lines) == 50 and lines != arithmetic_path().read_bytes().splitlines()[:50]


def test_the_shipped_task_reads_every_line_and_its_answers_score_one():
    assert load_reward("exact_match").name == "exact_match"
    records = list(JsonlPrompts(arithmetic_path(), "prompt", "answer"))
    assert len(records) == 4000 and len({r.text for r in records}) > 3900
    for r in records:
        assert r.text.endswith("Put the final answer in \\boxed{}.")
        assert int(r.label) >= 0
        assert exact_match(response=f"so \\boxed{{{r.label}}}", label=r.label) == 1.0
        assert exact_match(response=f"so \\boxed{{{int(r.label) + 1}}}", label=r.label) == 0.0


def test_the_answers_are_the_arithmetic_of_the_prompt():
    """Recompute a few problem kinds from their text: the labels are right, not just well formed."""
    import re

    checked = 0
    for r in JsonlPrompts(arithmetic_path(), "prompt", "answer"):
        nums = [int(n) for n in re.findall(r"\d+", r.text)]
        if " finds " in r.text:
            assert int(r.label) == nums[0] + nums[1]
        elif " gave " in r.text:
            assert int(r.label) == nums[0] - nums[1]
        elif "full boxes" in r.text:
            assert int(r.label) == nums[0] * nums[1]
        elif "equally among" in r.text:
            assert int(r.label) * nums[1] == nums[0]
        elif "change" in r.text:
            assert int(r.label) == nums[2] - nums[0] * nums[1]
        else:
            assert int(r.label) == nums[0] + nums[1] * nums[2] - nums[3]
        checked += 1
    assert checked == 4000
