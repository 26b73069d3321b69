"""Rendering of ``ftkit train``: the live progress line and the final report.

``step_line`` is one stderr line per optimizer step. ``render`` writes the command's data
(stdout) in the chosen format: the run summary (steps, rewards, final state, engine
fingerprints), then the forensics, i.e. the analyzer's result over the run's own event log,
rendered exactly as ``ftkit analyze-events`` renders it.
"""

from __future__ import annotations

from typing import Any

from ftkit.report.sink import Format, Output


def step_line(r: Any) -> str:
    """``rollout 1/3  step 2/6  loss ...  reward ...  cells 2/2  1234 tok/s`` (a ``StepReport``),
    plus ``  N attempts`` when faults made the step retry."""
    state = f"  [yellow]{r.attempts} attempts[/yellow]" if r.attempts > 1 else ""
    return (
        f"rollout {r.rollout + 1}/{r.rollouts}  step {r.step + 1}/{r.steps}  loss {r.loss:+.5f}  "
        f"reward {r.reward:.3f}  grad_norm {r.grad_norm:.4g}  cells {r.cells_alive}/{r.cells}  "
        f"{r.tokens_per_s:,.0f} tok/s{state}"
    )


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
        "engine_fingerprints": [{"version": v, "engines": totals} for v, totals in enumerate(result.engine_totals)],
        "checkpoints": result.checkpoints,
    }


def render(output: Output, result: Any, outcome: str) -> None:
    """Write the final report of a run to stdout in ``output.format``; ``outcome`` is the
    analyzer's verdict (``pass`` / ``fail``) for the command's ``--fail-on``."""
    analysis = result.analysis
    for note in analysis.notes:
        output.warn(note)
    if output.format is Format.json:
        from ftkit.report.analysis_formats import json_document

        output.json(
            {
                "command": "train",
                "verdict": outcome,
                "run": run_summary(result),
                "analysis": json_document(analysis, outcome),
            }
        )
    elif output.format is Format.github:
        from ftkit.report.analysis_formats import github_text, step_summary
        from ftkit.report.github import append_step_summary

        output.data(github_text(analysis, outcome))
        append_step_summary(
            f"## ftkit train {result.run}\n\n{_summary_text(result)}\n\n" + step_summary(analysis, outcome)
        )
    else:
        from rich.markup import escape

        from ftkit.report.analysis_human import render_human

        output.out.print(f"[bold]Trained[/bold] {escape(_summary_text(result))}")
        render_human(output.out, analysis, outcome)


def _summary_text(result: Any) -> str:
    rewards = " -> ".join(f"{r:.3f}" for r in result.rewards)
    last = result.engine_totals[-1] if result.engine_totals else []
    engines = (
        f"engines hold weights version {len(result.engine_totals) - 1} ({last[0][:16]}"
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
