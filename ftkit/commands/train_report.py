"""Rendering of ``ftkit train``'s final report (the live view is ``ftkit.report.live``).

``report`` is the command's ``Report``
for ``ftkit.report.emit``: the run summary (steps, rewards, final state, engine
fingerprints), then the forensics, i.e. the analyzer's result over the run's own event log,
rendered exactly as ``ftkit analyze-events`` renders it; with ``--expect-equal`` the
comparison with the reference run (``with_expect_equal``) follows.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console

from ftkit.report.emit import Report


def run_summary(result: Any) -> dict[str, Any]:
    """What the run did (the ``run`` part of the JSON document)."""
    return {
        "run": result.run,
        "run_dir": str(result.run_dir),
        "steps_committed": result.steps_committed,
        "steps_total": result.steps_total,
        "seconds": round(result.seconds, 3),
        "rewards": result.rewards,
        "final_files": result.final_files,
        "first_rollout": result.first_rollout,
        "engine_fingerprints": [
            {"version": v, "engines": totals} for v, totals in enumerate(result.engine_totals, result.first_rollout)
        ],
        "checkpoints": result.checkpoints,
    }


def verdict_report(result: Any, fail_on: Any) -> Report:
    """The report of a finished run: its verdict FAIL on any error finding (or one at or above
    ``fail_on``), its exit code set by ``fail_on`` alone (``--fail-on never``: exit 0, still FAIL),
    as ``analyze-events`` does."""
    from ftkit.findings import shown_verdict
    from ftkit.report.emit import with_fail_on

    findings = result.analysis.findings
    return with_fail_on(report(result, shown_verdict(findings, fail_on)), findings, fail_on)


def report(result: Any, outcome: str) -> Report:
    """The ``Report`` of a run: the run summary, then the analyzer's result over its own log
    (``ftkit.report.analysis_formats.report``) with the run added to every rendering."""
    from dataclasses import replace

    from ftkit.report.analysis_formats import report as analysis_report
    from ftkit.report.escaping import literal, md_text

    analysis = analysis_report(result.analysis, outcome)

    def human(console: Console) -> None:
        console.print(f"[bold]Trained[/bold] {literal(_summary_text(result))}")
        analysis.human(console)

    return replace(
        analysis,
        command="train",
        document=lambda: {"command": "train", "run": run_summary(result), "analysis": analysis.document()},
        human=human,
        step_summary=lambda: (
            f"## ftkit train {md_text(result.run)}\n\n{md_text(_summary_text(result))}\n\n" + analysis.step_summary()
        ),
    )


def _summary_text(result: Any) -> str:
    rewards = " -> ".join(f"{r:.3f}" for r in result.rewards)
    if result.first_rollout:
        rewards = f"(resumed at rollout {result.first_rollout}) {rewards}"
    last = result.engine_totals[-1] if result.engine_totals else []
    engines = (
        f"engines hold weights version {result.first_rollout + len(result.engine_totals) - 1} ({last[0][:16]}"
        f"{'' if len(set(last)) == 1 else ', ENGINES DIFFER'})"
        if last
        else "no engine weights"
    )
    published = [c for c in result.checkpoints if c["published"]]
    checkpoints = (
        f"; checkpoints: {len(published)} published"
        + (f" (last {published[-1]['path']})" if published else "")
        + f", {len(result.checkpoints) - len(published)} rejected"
        if result.checkpoints
        else ""
    )
    return (
        f"{result.run_dir}: {result.steps_committed}/{result.steps_total} steps committed in "
        f"{result.seconds:.1f}s; reward per rollout {rewards}; final state in "
        f"{', '.join(result.final_files) or '-'}; {engines}{checkpoints}"
    )


def with_expect_equal(shown: Report, compared: Any) -> Report:
    """``shown`` with the comparison against the reference run (``ftkit.runs.compare.RunsResult``)
    added: its findings and a line in every format; a divergence fails the run (exit 1)."""
    from dataclasses import replace

    from ftkit.report.escaping import literal, md_text
    from ftkit.report.runs_formats import document, summary_line

    line = f"expect-equal {' '.join(compared.a)}: {summary_line(compared, compared.verdict)}"
    base_human, base_doc, base_md = shown.human, shown.document, shown.step_summary
    failed = compared.verdict == "fail"

    def human(console: Console) -> None:
        base_human(console)
        colour = "red" if failed else "green"
        console.print(f"[bold {colour}]{literal(line)}[/bold {colour}]")

    return replace(
        shown,
        verdict="fail" if failed else shown.verdict,
        findings=[*shown.findings, *compared.findings],
        summary=f"{shown.summary}; {line}",
        document=lambda: {**base_doc(), "expect_equal": {"verdict": compared.verdict, **document(compared)}},
        human=human,
        step_summary=lambda: f"{base_md()}\n\n{md_text(line)}",
        exit_fail=failed or (shown.exit_fail if shown.exit_fail is not None else shown.verdict == "fail"),
    )
