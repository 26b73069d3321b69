"""The HTML page of ``ftkit compare-runs``: the cause, the verdict, a per-step strip of equal and
differing steps with the first divergence marked, the evidence table, the config differences and
the findings (self-contained: ``ftkit.report.html_page``)."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from ftkit.report.html_page import finding_list, legend, page, table
from ftkit.report.runs_text import cause_line, first_line
from ftkit.runs.compare import RunsResult

COLOURS = {"equal": "#2da44e", "differs": "#cf222e", "only_a": "#8c959f", "only_b": "#d0d7de"}
CELL, HEIGHT, MAX_CELLS = 8, 22, 2000


def strip_svg(strip: list[dict[str, Any]], first_step: int | None) -> str:
    """One cell per step (runs of more than ``MAX_CELLS`` steps are scaled), red where the runs
    differ, a black marker at the first divergence."""
    total = sum(r["count"] for r in strip) or 1
    width = min(total, MAX_CELLS) * CELL
    scale = width / total
    parts, x = [], 0.0
    for r in strip:
        w = r["count"] * scale
        title = f"steps {r['from']}-{r['to']}: {r['status']}" if r["count"] > 1 else f"step {r['from']}: {r['status']}"
        parts.append(
            f"<rect x='{x:.2f}' y='4' width='{max(w, 0.5):.2f}' height='{HEIGHT}' fill='{COLOURS[r['status']]}'>"
            f"<title>{escape(title)}</title></rect>"
        )
        if first_step is not None and r["from"] <= first_step <= r["to"] and r["status"] == "differs":
            fx = x + (first_step - r["from"]) * scale
            parts.append(
                f"<path d='M{fx:.2f},0 l4,-0 l-4,6 l-4,-6 z' fill='#000'/>"
                f"<rect x='{fx:.2f}' y='2' width='2' height='{HEIGHT + 4}' fill='#000'>"
                f"<title>first divergence: step {first_step}</title></rect>"
            )
        x += w
    return (
        f"<div class='scroll'><svg width='{width + 8}' height='{HEIGHT + 24}' role='img' "
        f"aria-label='per-step comparison'>{''.join(parts)}"
        f"<text x='0' y='{HEIGHT + 20}'>step {strip[0]['from'] if strip else 0}</text>"
        f"<text x='{width}' y='{HEIGHT + 20}' text-anchor='end'>step {strip[-1]['to'] if strip else 0}</text>"
        f"</svg></div>"
    )


def render_html(result: RunsResult, verdict: str, base: Path | None) -> str:
    first = result.first_divergence
    body = [f"<h1>ftkit compare-runs: <span class='{verdict}'>{verdict.upper()}</span></h1>"]
    cause = cause_line(result)
    if cause:
        body.append(f"<p class='fail'>{escape(cause)}</p>")
    body.append(f"<p>{escape(first_line(result))}</p>")
    body.append(
        f"<p class='muted mono'>A: {escape(' '.join(result.a))}<br>B: {escape(' '.join(result.b))}<br>"
        f"{escape(result.options.tolerance.describe())}</p>"
    )
    body.append("<h2>Steps</h2>")
    body.append(legend([(k.replace("_", " "), c) for k, c in COLOURS.items()]))
    body.append(strip_svg(result.strip, first["step"] if first else None))
    body.append("<h2>Evidence</h2>")
    body.append(
        table(
            ("evidence", "compared", "differ", "only in A", "only in B"),
            [
                (escape(k), str(v["compared"]), str(v["differ"]), str(v["a_only"]), str(v["b_only"]))
                for k, v in result.kinds.items()
            ],
        )
    )
    if result.config:
        body.append("<h2>Config differences</h2>")
        body.append(
            table(
                ("field", "A", "B", "kind"),
                [
                    (escape(r["field"]), escape(repr(r["a"])), escape(repr(r["b"])), escape(r["kind"]))
                    for r in result.config
                ],
            )
        )
    body.append("<h2>Findings</h2>")
    body.append(finding_list(result.findings, "findings", base))
    return page("ftkit compare-runs", body)
