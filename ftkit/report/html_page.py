"""Building blocks shared by ftkit's self-contained HTML reports (``timeline_html``, ``html``).

Every page is one file: inline CSS, inline SVG and a few lines of inline script (no network,
no external assets, opens offline). ``page`` wraps a body; ``table`` renders rows;
``finding_list`` renders findings collapsed (``<details>``) with a search box that filters
rows as one types, at most ``MAX_ROWS`` rows (the rest are counted, the machine formats
carry them all); ``where_link`` links a finding's file and line. Text is always escaped
here, so callers pass plain strings.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from html import escape
from pathlib import Path
from urllib.parse import quote

from ftkit.errors import UsageError
from ftkit.findings import Finding

MAX_ROWS = 1000

CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,sans-serif;margin:20px 28px;color:#1f2328;background:#fff}
h1{font-size:21px;margin:0 0 6px}h2{font-size:17px;margin:22px 0 6px;border-bottom:1px solid #d8dee4;padding-bottom:3px}
table{border-collapse:collapse;margin:6px 0}
td,th{border:1px solid #d8dee4;padding:2px 8px;text-align:left;font-size:13px;vertical-align:top}
th{background:#f6f8fa}.num{text-align:right;font-variant-numeric:tabular-nums}
.mono,code{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px}
.pass{color:#1a7f37;font-weight:600}.fail{color:#cf222e;font-weight:600}.sev-error{color:#cf222e}
.sev-warning{color:#9a6700}.sev-info{color:#57606a}.muted{color:#57606a}
details{margin:6px 0}summary{cursor:pointer;font-weight:600}
input.search{margin:6px 0;padding:3px 6px;width:26em;font:inherit}
.legend span{display:inline-block;margin-right:14px;font-size:12px}
.swatch{display:inline-block;width:12px;height:12px;vertical-align:-2px;margin-right:4px;border:1px solid #0002}
.scroll{overflow-x:auto;max-width:100%}svg text{font:11px system-ui,sans-serif;fill:#1f2328}
svg.chart text{font-size:17px}svg.chart text.title{font-size:22px;font-weight:600}
@media (max-width:640px){body{margin:12px}table{display:block;overflow-x:auto;max-width:100%}
input.search{width:100%;box-sizing:border-box}}
.kv{display:grid;grid-template-columns:max-content auto;gap:1px 14px}.kv b{font-weight:600}
"""

# Filters the rows of a table by the text of a search box (``data-filter`` names the table id).
SEARCH_JS = """
document.querySelectorAll('input[data-filter]').forEach(function(box){
  var rows=document.getElementById(box.dataset.filter).tBodies[0].rows;
  box.addEventListener('input',function(){
    var q=box.value.toLowerCase();
    for(var i=0;i<rows.length;i++){rows[i].style.display=rows[i].textContent.toLowerCase().indexOf(q)<0?'none':'';}
  });
});
"""


def page(title: str, body: Iterable[str], script: str = "") -> str:
    """A complete HTML document: ``body`` parts are trusted markup (built with these helpers)."""
    js = f"<script>{SEARCH_JS}{script}</script>"
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>\n"
        + "\n".join(body)
        + f"\n{js}</body></html>\n"
    )


def table(header: Sequence[str], rows: Iterable[Sequence[str]], table_id: str | None = None) -> str:
    """A table; cells are trusted markup (escape text with ``escape`` or ``cell``)."""
    ident = f" id='{table_id}'" if table_id else ""
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def num(value: float | int | None, fmt: str = ".3g") -> str:
    """A number for a table cell (``-`` for None, NaN shown as ``NaN``)."""
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return format(value, fmt) if isinstance(value, float) else str(value)


def page_dir(page: Path) -> Path | None:
    """The directory links of a page written to ``page`` are relative to: the directory the
    user named for a regular file (or one still to be made); None for a special file
    (``/dev/stdout``, a FIFO), whose page ends up who knows where."""
    return Path(os.path.abspath(page)).parent if not page.exists() or page.is_file() else None


def where_link(file: str | None, line: int | None, base: Path | None = None) -> str:
    """``file:line`` linking to the file: a URL relative to ``base`` (the page's directory, see
    ``page_dir``), so the report and its inputs can move together (a CI artifact, a copied run
    directory); an absolute ``file://`` URL without a base or across drives. A line adds a
    ``#L<line>`` anchor, the line link of GitHub, GitLab and most artifact viewers."""
    if not file:
        return "-"
    text = f"{Path(file).name}:{line}" if line else Path(file).name
    target = Path(os.path.abspath(file))
    try:
        href = quote(Path(os.path.relpath(target, base)).as_posix()) if base is not None else target.as_uri()
    except ValueError:  # another drive (Windows)
        href = target.as_uri()
    href += f"#L{line}" if line else ""
    return f"<a class='mono' href='{escape(href)}'>{escape(text)}</a>"


def finding_list(findings: Sequence[Finding], list_id: str, base: Path | None, open_up_to: int = 20) -> str:
    """Findings in a collapsed, searchable table (open by default when there are few); their
    files linked relative to ``base`` (``where_link``)."""
    if not findings:
        return "<p class='pass'>No findings.</p>"
    shown = findings[:MAX_ROWS]
    rows = []
    for f in shown:
        ev = f.evidence
        rows.append(
            (
                f"<span class='sev-{f.severity.value}'>{escape(f.code)}</span>",
                escape(f.severity.value),
                escape(f.rule),
                f"<span class='mono'>{escape(f.message)}</span>",
                where_link(ev.get("file"), ev.get("line"), base),
            )
        )
    more = len(findings) - len(shown)
    note = f"<p class='muted'>{more} more finding(s) not listed here; --format json has them all.</p>" if more else ""
    opened = " open" if len(findings) <= open_up_to else ""
    return (
        f"<details{opened}><summary>{len(findings)} finding(s)</summary>"
        f"<input class='search' type='search' placeholder='filter findings' data-filter='{list_id}'>"
        + table(("code", "severity", "rule", "message", "where"), rows, list_id)
        + note
        + "</details>"
    )


def kv(pairs: Iterable[tuple[str, str]]) -> str:
    """A two-column key/value block; values are trusted markup."""
    return "<div class='kv'>" + "".join(f"<b>{escape(k)}</b><span>{v}</span>" for k, v in pairs) + "</div>"


def legend(items: Iterable[tuple[str, str]]) -> str:
    """Colour swatches with their labels."""
    return (
        "<div class='legend'>"
        + "".join(f"<span><i class='swatch' style='background:{c}'></i>{escape(label)}</span>" for label, c in items)
        + "</div>"
    )


def check_target(path: Path) -> None:
    """Exit 2 (``UsageError``) unless ``path`` can be an output file: its directory exists and
    it is not itself a directory. Called before the work, so a typo costs nothing."""
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise UsageError(f"--html {path}: is a directory", "give a file name, e.g. --html report.html")
    if not parent.is_dir():
        raise UsageError(f"--html {path}: directory {parent} does not exist", f"create it first: mkdir -p {parent}")


def write_page(path: Path, html: str) -> None:
    """Write a report (``ftkit.report.report_file``: atomically; special files in place)."""
    from ftkit.report.report_file import write_report_file

    write_report_file(path, html.encode("utf-8"))


def fmt_s(t: float) -> str:
    """A duration for an axis or a caption: seconds, minutes past two, hours past one."""
    if t >= 3600:
        return f"{t / 3600:.2f}h"
    if t >= 120:
        return f"{t / 60:.1f}m"
    return f"{t:.3g}s"


def nice_ticks(span: float, n: int) -> list[float]:
    """About ``n`` round tick positions in [0, span]."""
    if span <= 0:
        return [0.0]
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(span / step) + 1)]
