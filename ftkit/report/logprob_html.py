"""The HTML report's "Engine vs trainer log-probs" section (``ftkit.analysis.logprob_view``).

Three tables: the checked steps (a GRPO run's rollout first steps) with their compared and
differing tokens and figures, the same by response position (a mismatch at the first response
token points at a template or shift error, one growing along the response at the weights), and
per weights version the canary comparison. A differing count is marked like a failed step.
"""

from __future__ import annotations

import math
from html import escape

from ftkit.analysis.logprob_view import LogprobView, Tally
from ftkit.report.html_page import table

MAX_ROWS = 200  # steps / versions shown; the rest are summarised in one line


def _num(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.3g}"


def _differing(n: int) -> str:
    return f"<span class='fail'>{n}</span>" if n else "0"


def _tally_cells(t: Tally) -> list[str]:
    return [str(t.tokens), _differing(t.differing), _num(t.max_abs), _num(t.mean_abs), _num(t.k3)]


def logprob_section(view: LogprobView) -> str:
    """The section's markup; a short note when the log holds no log-prob evidence."""
    if not view:
        return (
            "<p class='muted'>No engine-vs-trainer log-probs in this log (GRPO runs log "
            "<code>logprob_check</code>, <code>ftkit train</code> runs at --pp 1 <code>canary_logprobs</code>).</p>"
        )
    parts = []
    head = ("tokens", "differing", "max |delta|", "mean |delta|", "k3")
    if view.steps:
        rows = [[str(r), str(s), *_tally_cells(t)] for (r, s), t in sorted(view.steps.items())]
        parts += ["<h3>Rollout samples, at each rollout's first step</h3>", _capped(("rollout", "step", *head), rows)]
        rows = [[str(k), *_tally_cells(t)] for k, t in sorted(view.positions.items())]
        parts += ["<h3>By response position (0: the first response token)</h3>", table(("position", *head), rows)]
    if view.canaries:
        rows = []
        for version, c in sorted(view.canaries.items()):
            engines, differing, worst = c.compared()
            rows.append(
                [str(version), str(len(c.engines)), str(c.trainers), str(engines), _differing(differing), _num(worst)]
            )
        parts += [
            "<h3>Canary set, per weights version (engines against the first trainer)</h3>",
            _capped(("version", "engines", "trainers", "compared", "differing", "max |delta|"), rows),
        ]
    return "".join(parts)


def _capped(header: tuple[str, ...], rows: list[list[str]]) -> str:
    shown = table(header, rows[:MAX_ROWS])
    if len(rows) > MAX_ROWS:
        shown += f"<p class='muted'>{escape(str(len(rows) - MAX_ROWS))} more rows not shown.</p>"
    return shown
