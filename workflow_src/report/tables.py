"""Small self-contained HTML tables for the Snakemake report (it shows HTML inline)."""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence

_STYLE = ("<style>table{border-collapse:collapse;font:13px sans-serif}"
          "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}"
          "th{background:#f2f2f2}td.ok{background:#d9f2d9}td.bad{background:#f8d0d0}</style>")


def html_table(header: Sequence[str], rows: Iterable[Sequence[object]], title: str | None = None,
               cell_class=None) -> str:
    """A complete HTML page holding one table. `cell_class(row, col, value)` may return a CSS class."""
    out = ["<!doctype html><html><head><meta charset='utf-8'>", _STYLE, "</head><body>"]
    if title:
        out.append(f"<h3>{html.escape(title)}</h3>")
    out.append("<table><tr>" + "".join(f"<th>{html.escape(str(h))}</th>" for h in header) + "</tr>")
    for i, row in enumerate(rows):
        cells = []
        for j, v in enumerate(row):
            cls = cell_class(i, j, v) if cell_class else None
            attr = f" class='{cls}'" if cls else ""
            cells.append(f"<td{attr}>{html.escape(str(v))}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table></body></html>\n")
    return "".join(out)
