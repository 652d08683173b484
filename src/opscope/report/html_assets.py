"""Files the HTML reports inline: their own scripts and styles, and the chart library.

The chart library is uPlot 1.6.32 (MIT, https://github.com/leeoniya/uPlot; the minified
build from npm and its LICENSE are in ``assets/``): 51 KB of JavaScript and 2 KB of CSS,
canvas charts with axes, a live legend that shows every series' value under the cursor,
and zoom by dragging. It is inlined so that a report is one file that opens offline.
"""

from __future__ import annotations

from importlib import resources

CHART_LIBRARY = ("uplot.iife.min.js", "uplot.min.css")


def asset(name: str) -> str:
    """The text of ``assets/<name>``, safe inside an inline ``<script>`` or ``<style>``."""
    text = resources.files("opscope.report").joinpath("assets").joinpath(name).read_text(encoding="utf-8")
    return text.replace("</script", "<\\/script").replace("</style", "<\\/style")


def chart_library() -> str:
    """The chart library as inline ``<style>`` and ``<script>`` elements (defines ``uPlot``)."""
    script, style = CHART_LIBRARY
    return f"<style>{asset(style)}</style>\n<script>{asset(script)}</script>\n"
