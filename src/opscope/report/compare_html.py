"""The comparison as one self-contained, offline HTML page.

The page holds its data as JSON inside ``<script type="application/json">`` (with ``<``,
``>`` and ``&`` escaped, so no name can close the tag) and its script and style inline
(``report/assets/compare_report.js`` / ``.css``, and the chart library of
:mod:`opscope.report.html_assets`). The script draws the error along the execution order
(uPlot: log scale, the op under the cursor in the legend, drag to zoom), a sortable and filterable
table, the culprit with its inputs and outputs, and its data-flow neighbourhood. It puts every name in the page through
``textContent``, never through HTML parsing. ``#filter=TEXT&status=failed`` in the URL
applies a filter on load, ``#hover`` moves the cursor onto the culprit as a mouse would. When
done it sets ``data-ready``, ``data-chart-points``, ``data-chart-size``, ``data-rows-visible``
(and ``data-hover``) on ``<body>`` (tests read these from the DOM).
"""

from __future__ import annotations

import html
import json
import math
from typing import Any

from opscope.compare.pairs_file import PREVIEW_ROWS
from opscope.compare.result import CompareResult, json_safe
from opscope.report import register_renderer
from opscope.report.html_assets import asset, chart_library

MAX_ROWS = PREVIEW_ROWS  # pairs embedded at most (pairs.csv has them all)
TABLE_COLUMNS = ("order", "rank", "step", "phase", "module", "op", "call", "io", "slot", "param", "kind",
                 "status", "verdict", "mode", "error", "tolerance", "input_error", "rel_l2", "cosine",
                 "max_abs", "snr_db", "dtype_target", "dtype_reference", "shape_target", "source", "note")


@register_renderer("CompareResult", "html")
def render(result: CompareResult) -> str:
    """The page, as a string."""
    data = {"summary": result.to_summary(), "pairs": _pairs(result)}
    payload = safe_json(data)
    title = html.escape(f"opscope compare: {result.verdict.replace('_', ' ')}")
    js = asset("compare_report.js")
    css = asset("compare_report.css")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">"
        f"<title>{title}</title>{chart_library()}<style>{css}</style></head>\n<body>\n"
        f"<noscript>This report needs JavaScript. The same data is in summary.json and pairs.csv.</noscript>\n"
        f"<script id=\"opscope-data\" type=\"application/json\">{payload}</script>\n"
        f"<script>{js}</script>\n</body></html>\n")


def safe_json(data: Any) -> str:
    """JSON that can sit inside a <script> element: no '<', '>' or '&' left unescaped."""
    text = json.dumps(json_safe(data), ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _pairs(result: CompareResult) -> dict[str, Any]:
    """Columnar pairs for the page; beyond MAX_ROWS, the failed and unpaired ones first
    (at most MAX_ROWS of them), then others in execution order."""
    table, truncated = result.pairs_file.preview(MAX_ROWS)
    columns = {}
    for name in TABLE_COLUMNS:
        if name in table.schema.names:
            columns[name] = [_value(v) for v in table.column(name).to_pylist()]
    return {"columns": columns, "rows": table.num_rows, "total": result.pairs_file.num_rows,
            "truncated": truncated}


def _value(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v

