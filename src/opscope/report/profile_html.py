"""Self-contained offline HTML report of a profile: ``render(data) -> str``.

One file, no network: the charts are drawn by the bundled chart library (uPlot, inlined;
see :mod:`opscope.report.html_assets`) from a JSON block, the tables are HTML. Every time
is in ms, as in ``opscope profile show``. Charts: step time per rank (outlier and
task-traced steps marked), phases stacked per step (rank selector) and per rank; hovering
shows the values in the legend. Sections without data are left out. Every name from the
profile (op names, shapes, paths) is escaped, in HTML with ``html.escape`` and in the JSON
block by escaping ``<``, ``>`` and ``&``, so an op called ``</script><script>...`` stays text.
"""

from __future__ import annotations

import html
import json
import statistics
from typing import Any

from opscope.profile.model import PHASES
from opscope.profile.summary import steady_steps
from opscope.report import register_renderer
from opscope.report.html_assets import asset, chart_library

PHASE_COLORS = {
    "data_wait": "#8c564b",
    "forward": "#1f77b4",
    "backward": "#ff7f0e",
    "communication": "#9467bd",
    "optimizer": "#2ca02c",
    "zero_grad": "#17becf",
    "other": "#b0b0b0",
}
MAX_POINTS = 4000  # steps per rank drawn; longer runs are drawn every n-th step
MS = 1e6


def _series(rows: list[Any]) -> dict[str, Any]:
    """One rank's steps as columns (ms), every ``stride``-th step."""
    stride = -(-len(rows) // MAX_POINTS) if rows else 1
    rows = rows[::stride]
    return {
        "step": [r.step for r in rows],
        "wall": [round(r.wall_ns / MS, 4) for r in rows],
        "traced": [r.task_trace for r in rows],
        "complete": [r.complete for r in rows],
        "phases": {p: [round(r.phases.get(p, 0) / MS, 4) for r in rows] for p in PHASES},
        "stride": stride,
    }


def _per_rank(data: Any, ranks: list[int], warmup: int) -> dict[str, list[float]]:
    """Median of each phase over each rank's steady steps (ms)."""
    out: dict[str, list[float]] = {p: [] for p in PHASES}
    for rank in ranks:
        steady = steady_steps([r for r in data.steps if r.rank == rank], warmup)
        for phase in PHASES:
            values = [r.phases.get(phase, 0) / MS for r in steady]
            out[phase].append(round(statistics.median(values), 4) if values else 0.0)
    return out


def _payload(data: Any) -> dict[str, Any]:
    s = data.summary
    ranks = sorted({r.rank for r in data.steps})
    by_rank = {rank: sorted((r for r in data.steps if r.rank == rank), key=lambda r: r.step) for rank in ranks}
    warmup = int(s.get("steps", {}).get("warmup", 1))
    return {
        "ranks": ranks,
        "series": {str(rank): _series(rows) for rank, rows in by_rank.items()},
        "phases": list(PHASES),
        "colors": PHASE_COLORS,
        "outliers": (s.get("outliers") or {}).get("steps", []),
        "per_rank": _per_rank(data, ranks, warmup) if len(ranks) > 1 else None,
    }


def _script_json(obj: Any) -> str:
    text = json.dumps(obj, separators=(",", ":"))
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _e(value: Any) -> str:
    return html.escape(str(value))


def _table(head: list[str], rows: list[list[Any]], cls: str = "") -> str:
    """An HTML table; numbers right-aligned."""
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td class='num'>{_e(v)}</td>" if isinstance(v, (int, float)) or _numeric(v)
                         else f"<td>{_e(v)}</td>" for v in row) + "</tr>"
        for row in rows
    )
    return f"<table class='{cls}'><tr>{th}</tr>{body}</table>"


def _numeric(v: Any) -> bool:
    return isinstance(v, str) and v.replace(".", "", 1).replace("x", "").replace("%", "").strip().isdigit()


def _facts(data: Any) -> str:
    s = data.summary
    steps, step_ms = s.get("steps", {}), s.get("step_ms", {})
    facts = [("status", data.status), ("ranks", ", ".join(str(r) for r in s.get("ranks", [])))]
    facts.append(("steps",
                  f"{steps.get('recorded', 0)} recorded, {steps.get('steady', 0)} steady, "
                  f"{steps.get('task_traced', 0)} task-traced"))
    if step_ms.get("n"):
        facts.append(("step time",
                      f"median {step_ms['median']:.3f} ms (p10 {step_ms['p10']:.3f}, p90 {step_ms['p90']:.3f}, mean "
                      f"{step_ms['mean']:.3f})"))
    task = s.get("task_trace", {})
    if task.get("ratio"):
        cost = f"{task['ratio']:.2f}x (median {task['traced_median_ms']:.3f} vs {task['plain_median_ms']:.3f} ms)"
        if task["ratio"] < 1:
            cost += "; below 1x: " + (task.get("why")
                                      or "noise or a busier machine during the unprofiled steps, not a speed-up")
        facts.append(("task trace cost", cost))
    return "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in facts)


def _notes(data: Any) -> str:
    s = data.summary
    lines = []
    load = s.get("machine_load") or {}
    if load.get("note"):
        lines.append(("load", load["note"]))
    outliers = (s.get("outliers") or {}).get("steps", [])
    if outliers:
        shown = ", ".join(f"step {o['step']}" + (f" (rank {o['rank']})" if len(s.get("ranks", [])) > 1 else "")
                          for o in outliers[:8])
        lines.append(("outliers", f"outlier steps (marked in red): {shown}; they make a mean exceed its median"))
    lines += [("warn", w) for w in data.warnings]
    return "".join(f"<p class='note {cls}'>{_e(text)}</p>" for cls, text in lines)


def _phase_section(s: dict[str, Any]) -> str:
    table = s.get("phases", {})
    seen = [p for p in PHASES if any(table.get(p, {}).get(k) for k in ("median_ms", "mean_ms", "share"))]
    if not seen:
        return ""
    rows = [[p, f"{table[p].get('median_ms', 0):.3f}", f"{table[p].get('mean_ms', 0):.3f}",
             f"{table[p].get('share', 0) * 100:.1f}%"] for p in seen]
    unseen = [p for p in PHASES if p not in seen]
    hint = f"<p class='muted'>not seen in these steps: {_e(', '.join(unseen))}</p>" if unseen else ""
    return "<h2>Phases (steady steps)</h2>" + _table(["phase", "median ms", "mean ms", "share of step"],
                                                     rows, "phases") + hint


def _outlier_section(s: dict[str, Any]) -> str:
    outliers = (s.get("outliers") or {})
    if not outliers.get("steps"):
        return ""
    rows = [[o["step"], o["rank"], f"{o['wall_ms']:.3f}", o["phase"], f"{o['phase_ms']:.3f}",
             f"{o.get('wait_ms', 0):.3f}"] for o in outliers["steps"]]
    title = f"<h2>Outlier steps (above {outliers['threshold_ms']:.3f} ms)</h2>"
    return title + _table(["step", "rank", "step ms", "phase that grew", "its ms", "CPU wait ms"], rows, "outliers")


def _ops_section(s: dict[str, Any]) -> str:
    ops = s.get("top_ops", [])[:20]
    if not ops:
        return ""
    shapes = any(o.get("shapes") for o in ops)
    device = any(o.get("device_us") for o in ops)
    head = ["op", "phase", "calls",
            "self ms/step", "total ms"] + (["device ms"] if device else []) + (["shapes"] if shapes else [])
    rows = []
    for o in ops:
        row = [o["name"], o["phase"], o["calls"], f"{o['self_us_per_step'] / 1000:.3f}", f"{o['total_us'] / 1000:.3f}"]
        row += [f"{o['device_us'] / 1000:.3f}"] if device else []
        row += [o["shapes"]] if shapes else []
        rows.append(row)
    hint = "" if shapes else "<p class='muted'>shapes: profile with record_shapes=True to see them</p>"
    return "<h2>Top operators (task-traced steps)</h2>" + _table(head, rows, "ops") + hint


def _slowest_section(s: dict[str, Any]) -> str:
    slow = s.get("slowest_ranks", {}).get("steps", [])
    if not slow:
        return ""
    worst = sorted(slow, key=lambda x: -x["behind_ms"])[:20]
    rows = [[w["step"], w["rank"], f"{w['wall_ms']:.3f}", f"{w['busy_ms']:.3f}", f"{w['median_busy_ms']:.3f}",
             f"{w['behind_ms']:.3f}"] for w in worst]
    return "<h2>Slowest ranks</h2>" + _table(["step", "slowest rank", "wall ms", "busy ms",
                                              "median busy ms", "behind ms"], rows, "slowest")


@register_renderer("ProfileData", "html")
def render(data: Any) -> str:
    """The whole page for a :class:`~opscope.profile.reader.ProfileData`."""
    s = data.summary
    payload = _payload(data)
    charts = ""
    if data.steps:
        charts = ("<h2>Step time</h2><div id='steps-chart' class='chart'></div>"
                  "<h2>Phases per step</h2><label>rank <select id='rank'></select></label>"
                  "<div id='phases-chart' class='chart'></div>")
        if payload["per_rank"] is not None:
            charts += "<h2>Phases per rank (median of steady steps)</h2><div id='ranks-chart' class='chart'></div>"
    title = _e(f"opscope profile: {data.path}")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'unsafe-inline'; "
        "style-src 'unsafe-inline'; img-src data:\">"
        f"<title>{title}</title>\n{chart_library()}<style>{asset('profile_report.css')}</style></head>\n"
        f"<body data-chart=\"pending\">\n<h1>{title}</h1>\n<table "
        f"class='facts'>{_facts(data)}</table>\n{_notes(data)}\n"
        f"{charts}{_phase_section(s)}{_outlier_section(s)}{_ops_section(s)}{_slowest_section(s)}\n"
        f"<script type=\"application/json\" id=\"opscope-data\">{_script_json(payload)}</script>\n"
        f"<script>{asset('profile_report.js')}</script>\n</body></html>\n"
    )
