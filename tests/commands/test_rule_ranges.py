"""The rule ranges README and --help name are the codes that exist (issue 24 item 10)."""

from __future__ import annotations

from pathlib import Path

from ftkit.checkpoint.codes import TABLE
from ftkit.commands.verify_checkpoint import HELP

README = Path(__file__).resolve().parents[2] / "README.md"


def test_verify_checkpoint_range_names_the_last_code() -> None:
    codes = sorted(TABLE.codes)
    span = f"{codes[0]}-{codes[-1]}"
    assert span in HELP and README.read_text().count(span) >= 2


def _runs(codes: list[str]) -> str:
    """``FT101-FT113, FT115``: the codes as runs of consecutive numbers."""
    nums = sorted(int(c[2:]) for c in codes)
    runs: list[list[int]] = []
    for n in nums:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(f"FT{r[0]}" if len(r) == 1 else f"FT{r[0]}-FT{r[-1]}" for r in runs)


def test_analyze_events_ranges_name_the_rules_that_exist() -> None:
    from ftkit.analysis.registry import all_rules
    from ftkit.commands.analyze_events import HELP as ANALYZE_HELP

    span = _runs(list(all_rules()))
    assert span in ANALYZE_HELP and README.read_text().count(span) >= 2
