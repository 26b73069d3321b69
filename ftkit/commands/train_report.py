"""Rendering of ``ftkit train``: the live progress line and the final report.

``step_line`` is one stderr line per optimizer step. ``render`` writes the command's data
(stdout) in the chosen format: the run summary (steps, rewards, final state, engine
fingerprints) and the analyzer's verdict with its findings.
"""

from __future__ import annotations

from typing import Any

from ftkit.analysis.findings import FailOn, Finding, verdict
from ftkit.report.sink import Format, Output


def step_line(r: Any) -> str:
    """``rollout 1/3  step 2/6  loss ...  reward ...  cells 2/2  1234 tok/s`` (a ``StepReport``)."""
    state = "" if r.committed else "  [red]DISCARDED[/red]"
    return (f"rollout {r.rollout + 1}/{r.rollouts}  step {r.step + 1}/{r.steps}  loss {r.loss:+.5f}  "
            f"reward {r.reward:.3f}  grad_norm {r.grad_norm:.4g}  cells {r.cells_alive}/{r.cells}  "
            f"{r.tokens_per_s:,.0f} tok/s{state}")


def summary(result: Any, findings: list[Finding], fail_on: FailOn) -> dict[str, Any]:
    """The machine-readable report (the JSON document, without ``schema_version``)."""
    analysis = result.analysis
    return {
        "command": "train",
        "run": result.run,
        "run_dir": str(result.run_dir),
        "steps_committed": result.steps_committed,
        "steps_total": result.steps_total,
        "seconds": round(result.seconds, 3),
        "rewards": result.rewards,
        "final_files": result.final_files,
        "engine_fingerprints": [{"version": v, "engines": totals} for v, totals in enumerate(result.engine_totals)],
        "verdict": verdict(findings, fail_on),
        "findings": [f.model_dump(mode="json") for f in findings],
        "rules": [r.model_dump(mode="json") for r in analysis.rules],
        "stats": analysis.stats,
    }


def render(output: Output, result: Any, findings: list[Finding], fail_on: FailOn) -> None:
    """Write the final report of a run to stdout in ``output.format``."""
    doc = summary(result, findings, fail_on)
    if output.format is Format.json:
        output.json(doc)
        return
    if output.format is Format.github:
        from ftkit.report.github import annotations, append_step_summary

        text = annotations(findings)
        if text:
            output.data(text)
        append_step_summary(f"### ftkit train {result.run}: {doc['verdict']}\n\n"
                            f"{result.steps_committed}/{result.steps_total} steps committed, "
                            f"{len(findings)} finding(s)")
        return
    _human(output, result, doc, findings)


def _human(output: Output, result: Any, doc: dict[str, Any], findings: list[Finding]) -> None:
    from rich.table import Table

    con = output.out
    rewards = " -> ".join(f"{r:.3f}" for r in result.rewards)
    last = result.engine_totals[-1] if result.engine_totals else []
    same = "all identical" if len(set(last)) == 1 else "DIFFER"
    con.print(f"run [bold]{result.run}[/bold] ({result.run_dir}): {result.steps_committed}/{result.steps_total} "
              f"steps committed in {result.seconds:.1f}s", markup=True)
    con.print(f"reward per rollout: {rewards}", markup=False)
    con.print(f"final state: {', '.join(result.final_files)}", markup=False)
    if last:
        con.print(f"engine weights (version {len(result.engine_totals) - 1}): {last[0]} on {len(last)} "
                  f"engine(s), {same}", markup=False)
    rules = doc["rules"]
    checked = sum(r["checked"] for r in rules)
    colour = "green" if doc["verdict"] == "pass" else "red"
    con.print(f"forensics: [{colour}][bold]{doc['verdict'].upper()}[/bold][/{colour}]: {len(findings)} finding(s), "
              f"{len(rules)} rule(s) checked {checked} item(s)", markup=True)
    if findings:
        table = Table(show_edge=False, header_style="bold")
        for col in ("code", "severity", "rule", "message"):
            table.add_column(col)
        for f in findings:
            table.add_row(f.code, f.severity.value, f.rule, f.message)
        con.print(table)
