"""Self-contained offline HTML report of a profile: ``render(data) -> str``.

No network: the chart is inline SVG drawn by inline JavaScript from a JSON block. Every
name from the profile (op names, shapes, paths) is escaped, in HTML with ``html.escape``
and in the JSON block by escaping ``<``, ``>`` and ``&``, so an op called
``</script><script>...`` stays text.
"""

from __future__ import annotations

import html
import json
from typing import Any

from opscope.report import register_renderer

PHASE_COLORS = {
    "data_wait": "#8c564b",
    "forward": "#1f77b4",
    "backward": "#ff7f0e",
    "communication": "#9467bd",
    "optimizer": "#2ca02c",
    "zero_grad": "#17becf",
    "other": "#c7c7c7",
}
MAX_POINTS = 4000


def _payload(data: Any) -> dict[str, Any]:
    steps = sorted(data.steps, key=lambda r: (r.rank, r.step))
    stride = max(1, len(steps) // MAX_POINTS + (len(steps) % MAX_POINTS > 0))
    rows = [
        {"rank": r.rank, "step": r.step, "wall": r.wall_ns / 1e6, "traced": r.task_trace, "complete": r.complete, "phases": {p: v / 1e6 for p, v in r.phases.items()}}
        for r in steps[::stride]
    ]
    summary = data.summary
    slow = summary.get("slowest_ranks", {})
    return {
        "rows": rows,
        "stride": stride,
        "colors": PHASE_COLORS,
        "phases": summary.get("phases", {}),
        "ops": summary.get("top_ops", [])[:20],
        "slowest": sorted(slow.get("steps", []), key=lambda s: -s["behind_ms"])[:20],
        "slowest_counts": slow.get("counts", {}),
    }


def _script_json(obj: Any) -> str:
    text = json.dumps(obj, separators=(",", ":"))
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


@register_renderer("ProfileData", "html")
def render(data: Any) -> str:
    """The whole page for a :class:`~opscope.profile.reader.ProfileData`."""
    s = data.summary
    step_ms = s.get("step_ms", {})
    overhead = s.get("task_trace", {}).get("ratio")
    facts = [
        ("status", data.status),
        ("ranks", ", ".join(str(r) for r in s.get("ranks", []))),
        ("steps recorded", s.get("steps", {}).get("recorded", 0)),
        ("median step", f"{step_ms.get('median', 0):.3f} ms" if step_ms.get("n") else "n/a"),
        ("task trace cost", f"{overhead:.2f}x" if overhead else "n/a"),
    ]
    fact_html = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in facts)
    warn_html = "".join(f"<li>{html.escape(w)}</li>" for w in data.warnings)
    return _PAGE.format(
        title=html.escape(f"opscope profile: {data.path}"),
        facts=fact_html,
        warnings=f"<ul class='warn'>{warn_html}</ul>" if warn_html else "",
        data=_script_json(_payload(data)),
        script=_SCRIPT,
    )


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'">
<title>{title}</title>
<style>
body {{ font: 14px system-ui, sans-serif; margin: 24px; color: #222; }}
table {{ border-collapse: collapse; margin: 8px 0 20px; }}
th, td {{ padding: 3px 10px; border-bottom: 1px solid #ddd; text-align: left; }}
td.num {{ text-align: right; font-variant-numeric: tabular-nums; }}
.warn {{ color: #a40; }} svg {{ background: #fafafa; border: 1px solid #eee; }}
.legend span {{ display: inline-block; margin-right: 14px; }}
.legend i {{ display: inline-block; width: 10px; height: 10px; margin-right: 4px; }}
</style></head>
<body data-chart="pending">
<h1>{title}</h1>
<table>{facts}</table>
{warnings}
<h2>Step time</h2><svg id="series" width="900" height="260"></svg>
<h2>Phases per step</h2>
<label>rank <select id="rank"></select></label>
<div class="legend" id="legend"></div>
<svg id="bars" width="900" height="260"></svg>
<h2>Phase breakdown (steady steps)</h2><table id="phase-table"></table>
<h2>Top operators</h2><table id="ops-table"></table>
<h2>Slowest ranks</h2><table id="slow-table"></table>
<script type="application/json" id="opscope-data">{data}</script>
<script>{script}</script>
</body></html>
"""

_SCRIPT = r"""
window.onerror = function (msg) { document.body.setAttribute('data-error', String(msg)); };
(function () {
  const D = JSON.parse(document.getElementById('opscope-data').textContent);
  const NS = 'http://www.w3.org/2000/svg';
  const W = 900, H = 260, L = 56, R = 12, T = 12, B = 28;
  function el(name, attrs, parent) {
    const e = document.createElementNS(NS, name);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function axes(svg, xmax, ymax, xlabel) {
    el('line', {x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: '#888'}, svg);
    el('line', {x1: L, y1: T, x2: L, y2: H - B, stroke: '#888'}, svg);
    const t1 = el('text', {x: 4, y: T + 10, 'font-size': 11}, svg); t1.textContent = ymax.toFixed(2) + ' ms';
    const t2 = el('text', {x: W - 120, y: H - 6, 'font-size': 11}, svg); t2.textContent = xlabel + ' ' + xmax;
  }
  const ranks = [...new Set(D.rows.map(r => r.rank))].sort((a, b) => a - b);
  const maxStep = Math.max(1, ...D.rows.map(r => r.step));
  const maxWall = Math.max(1e-9, ...D.rows.map(r => r.wall));
  const sx = s => L + (W - L - R) * s / maxStep, sy = v => H - B - (H - T - B) * v / maxWall;
  const series = document.getElementById('series');
  axes(series, maxStep, maxWall, 'step');
  const palette = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#17becf', '#8c564b', '#e377c2'];
  let points = 0;
  ranks.forEach((rank, i) => {
    const rows = D.rows.filter(r => r.rank === rank);
    el('polyline', {points: rows.map(r => sx(r.step) + ',' + sy(r.wall)).join(' '), fill: 'none', stroke: palette[i % 8], 'stroke-width': 1.5, 'data-rank': rank}, series);
    rows.forEach(r => {
      const c = el('circle', {cx: sx(r.step), cy: sy(r.wall), r: r.traced ? 3.5 : 2, fill: r.complete ? palette[i % 8] : '#000', class: 'pt'}, series);
      el('title', {}, c).textContent = 'rank ' + rank + ' step ' + r.step + ': ' + r.wall.toFixed(3) + ' ms' + (r.traced ? ' (task trace)' : '');
      points++;
    });
  });
  const order = Object.keys(D.colors);
  const legend = document.getElementById('legend');
  order.forEach(p => { const s = document.createElement('span'); const i = document.createElement('i'); i.style.background = D.colors[p]; s.appendChild(i); s.appendChild(document.createTextNode(p)); legend.appendChild(s); });
  const select = document.getElementById('rank');
  ranks.forEach(r => { const o = document.createElement('option'); o.value = r; o.textContent = r; select.appendChild(o); });
  function drawBars(rank) {
    const svg = document.getElementById('bars');
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    const rows = D.rows.filter(r => r.rank === rank);
    const ymax = Math.max(1e-9, ...rows.map(r => r.wall));
    axes(svg, rows.length ? rows[rows.length - 1].step : 0, ymax, 'step');
    const bw = Math.max(1, (W - L - R) / Math.max(rows.length, 1) - 1);
    let rects = 0;
    rows.forEach((r, k) => {
      let y = H - B;
      order.forEach(p => {
        const h = (H - T - B) * (r.phases[p] || 0) / ymax;
        if (h <= 0) return;
        y -= h;
        const rect = el('rect', {x: L + k * (bw + 1), y: y, width: bw, height: h, fill: D.colors[p], class: 'seg'}, svg);
        el('title', {}, rect).textContent = 'step ' + r.step + ' ' + p + ': ' + (r.phases[p] || 0).toFixed(3) + ' ms';
        rects++;
      });
    });
    document.body.setAttribute('data-bars', rects);
  }
  select.onchange = () => drawBars(Number(select.value));
  if (ranks.length) drawBars(ranks[0]);
  function table(id, head, rows) {
    const t = document.getElementById(id);
    const tr = document.createElement('tr');
    head.forEach(h => { const th = document.createElement('th'); th.textContent = h; tr.appendChild(th); });
    t.appendChild(tr);
    rows.forEach(row => {
      const r = document.createElement('tr');
      row.forEach(v => { const td = document.createElement('td'); td.textContent = v; if (typeof v === 'number') td.className = 'num'; r.appendChild(td); });
      t.appendChild(r);
    });
  }
  table('phase-table', ['phase', 'median ms', 'mean ms', 'share'], order.map(p => { const x = D.phases[p] || {}; return [p, x.median_ms || 0, x.mean_ms || 0, ((x.share || 0) * 100).toFixed(1) + '%']; }));
  table('ops-table', ['op', 'shapes', 'calls', 'self us', 'total us', 'device us', 'phase'], D.ops.map(o => [o.name, o.shapes, o.calls, o.self_us, o.total_us, o.device_us, o.phase]));
  table('slow-table', ['step', 'slowest rank', 'wall ms', 'busy ms', 'median busy ms', 'behind ms'], D.slowest.map(s => [s.step, s.rank, s.wall_ms, s.busy_ms, s.median_busy_ms, s.behind_ms]));
  document.body.setAttribute('data-points', points);
  document.body.setAttribute('data-ranks', ranks.length);
  document.body.setAttribute('data-chart', 'ok');
})();
"""
