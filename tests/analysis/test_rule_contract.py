"""The rule contract of ``ftkit.analysis.registry``: a rule written to its documentation works,
and the replay depends on the ``RuleHooks`` protocol, not on the registry (no import cycle)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, ClassVar

import ftkit.analysis.replay as replay_mod
from ftkit.analysis import registry
from ftkit.analysis.engine import analyze_paths
from ftkit.findings import Severity
from ftkit.testing.synthetic import generate
from ftkit.testing.synthetic_spec import SyntheticSpec


class _EveryThirdFingerprint(registry.Rule):
    """Written from the registry's docstring only: subscribe, check, report with a location."""

    code: ClassVar[str] = "FT990"
    name: ClassVar[str] = "doc-contract"
    severity: ClassVar[Severity] = Severity.warning
    description: ClassVar[str] = "flags every third fingerprint event (test rule)"
    fix: ClassVar[str] = "nothing to fix: a test rule"
    events: ClassVar[tuple[str, ...]] = ("state_fingerprint",)

    def __init__(self, replay: Any) -> None:
        super().__init__(replay)
        self.seen = 0
        self.steps = 0
        self.finished = False

    def on_event(self, event: dict[str, Any], fi: int, line: int) -> None:
        self.check()
        self.seen += 1
        if self.seen % 3 == 0:
            self.report(f"event {event['type']} #{self.seen}", where=self.replay.where(fi, line), n=self.seen)

    def on_step(self, record: Any) -> None:
        self.steps += 1

    def finish(self) -> None:
        self.finished = True


def test_a_rule_written_to_the_documentation_reports_with_location_and_fix(tmp_path: Path, monkeypatch: Any) -> None:
    generate(tmp_path, SyntheticSpec(cells=2, engines=1, rollouts=1, steps_per_rollout=2, samples_per_rollout=8))
    monkeypatch.setitem(registry.RULES, _EveryThirdFingerprint.code, _EveryThirdFingerprint)
    result = analyze_paths([tmp_path / "events"], select=["FT990"])
    (summary,) = [r for r in result.rules if r.code == "FT990"]  # beside the integrity rules, which always run
    assert summary.code == "FT990" and summary.checked >= 3 and summary.findings == summary.checked // 3
    assert summary.fix == _EveryThirdFingerprint.fix
    first = result.findings[0]
    assert first.code == "FT990" and first.severity is Severity.warning and first.fix == _EveryThirdFingerprint.fix
    assert first.evidence["n"] == 3 and isinstance(first.evidence["line"], int)
    assert Path(first.evidence["file"]).is_file()
    assert first.where() == f"{first.evidence['file']}:{first.evidence['line']}"


def _imports(module: Any) -> set[str]:
    tree = ast.parse(Path(module.__file__).read_text())
    return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }


def test_replay_does_not_import_the_registry() -> None:
    assert "ftkit.analysis.registry" not in _imports(replay_mod)
    assert not hasattr(replay_mod.Replay, "check") and "notes" not in replay_mod.Replay.__init__.__code__.co_names
