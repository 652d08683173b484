/* opscope compare report: everything from the JSON block, names only via textContent. */
(function () {
  "use strict";
  var body = document.body;
  window.addEventListener("error", function (e) { body.setAttribute("data-js-error", String(e.message)); });
  var DATA = JSON.parse(document.getElementById("opscope-data").textContent);
  var S = DATA.summary, P = DATA.pairs, C = P.columns, N = P.rows;
  var SVG = "http://www.w3.org/2000/svg";

  function el(tag, attrs, text, parent) {
    var e = document.createElement(tag);
    if (attrs) { for (var k in attrs) { e.setAttribute(k, attrs[k]); } }
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    if (parent) { parent.appendChild(e); }
    return e;
  }
  function sv(tag, attrs, parent) {
    var e = document.createElementNS(SVG, tag);
    for (var k in attrs) { e.setAttribute(k, attrs[k]); }
    if (parent) { parent.appendChild(e); }
    return e;
  }
  function num(v) { if (v === "inf") { return Infinity; } if (v === "-inf") { return -Infinity; } if (v === null || v === undefined || v === "nan") { return NaN; } return Number(v); }
  function fmt(v) {
    var x = num(v);
    if (typeof v === "string" && isNaN(x)) { return v; }
    if (isNaN(x)) { return ""; }
    if (!isFinite(x)) { return x > 0 ? "inf" : "-inf"; }
    if (x === 0 || Number.isInteger(x)) { return String(x); }
    var a = Math.abs(x);
    return (a >= 1e-3 && a < 1e5) ? x.toPrecision(4) : x.toExponential(3);
  }
  function where(f) {
    return (f.module || "(top level)") + " \u00b7 " + (f.kind === "root" && f.param ? "parameter " + f.param : f.op) +
      " \u00b7 " + f.phase + " \u00b7 step " + f.step + " \u00b7 rank " + f.rank;
  }

  // -- header ---------------------------------------------------------------------------------
  var h = el("h1", null, "opscope compare: ", body);
  el("span", { "class": "verdict-" + S.verdict }, S.verdict.replace("_", " "), h);
  el("div", { "class": "muted mono" }, "target " + S.target + "  \u2014  reference " + S.reference, body);
  var cards = el("div", { "class": "cards" }, null, body);
  Object.keys(S.counts).forEach(function (k) {
    var c = el("div", { "class": "card" }, null, cards); el("b", null, S.counts[k], c); el("span", { "class": "muted" }, k.replace("_", " "), c);
  });
  if (S.weaker) { el("p", { "class": "muted" }, "Note: " + S.weaker, body); }
  (S.notes || []).forEach(function (n) { el("p", { "class": "note" }, "Note: " + n, body); });
  if (S.problems && S.problems.length) {
    var det = el("details", null, null, body); el("summary", null, S.problems.length + " thing(s) skipped", det);
    var ul = el("ul", null, null, det); S.problems.forEach(function (p) { el("li", null, p, ul); });
  }

  // -- chart: error along the execution order (uPlot, log scale) -----------------------------
  el("h2", null, "Error along the execution order", body);
  el("div", { "class": "muted" }, "relative error (log scale) of every measured pair, by execution order; red: culprit, purple: root, orange: inherited failure; 0 is drawn at the bottom, inf at the top; hover for the op, drag to zoom, double-click to reset", body);
  var chartBox = el("div", { id: "chart" }, null, body);
  var points = 0;
  (function drawChart() {
    var err = C.error || [], status = C.status || [], verdict = C.verdict || [], ops = C.op || [], modules = C.module || [];
    var lo = Infinity, hi = -Infinity, i, v;
    for (i = 0; i < N; i++) { v = num(err[i]); if (v > 0 && isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); } }
    if (!isFinite(lo)) { lo = 1e-8; hi = 1; }
    var floor = Math.pow(10, Math.floor(Math.log10(lo)) - 1), ceil = Math.pow(10, Math.ceil(Math.log10(hi)) + 1);
    var kinds = ["identical", "passed", "failed", "root", "culprit"];
    var colors = { identical: "#b9c6d6", passed: "#7a8ca3", failed: "#f08c00", root: "#8e00d0", culprit: "#d00000" };
    var xs = [], cols = {}, at = [];
    kinds.forEach(function (k) { cols[k] = []; });
    for (i = 0; i < N; i++) {
      v = num(err[i]);
      if (isNaN(v) || status[i] === "unpaired" || status[i] === "skipped") { continue; }
      var cls = verdict[i] === "culprit" || verdict[i] === "root" ? verdict[i] : (cols[status[i]] ? status[i] : "passed");
      var y = v <= 0 ? floor : (!isFinite(v) ? ceil : v);
      xs.push(xs.length); at.push(i);
      kinds.forEach(function (k) { cols[k].push(k === cls ? y : null); });
      points++;
    }
    var data = [xs], series = [{ label: "pair", value: function (u, x) {
      if (x === null || at[x] === undefined) { return "\u2014"; }
      var k = at[x]; return "#" + (C.order ? C.order[k] : k) + " " + (modules[k] || "(top level)") + " \u00b7 " + (ops[k] || "");
    } }];
    kinds.forEach(function (k) {
      if (!cols[k].some(function (y) { return y !== null; })) { return; }
      data.push(cols[k]);
      series.push({ label: k, stroke: colors[k], paths: function () { return null; }, points: { show: true, size: k === "culprit" || k === "root" ? 8 : 4, fill: colors[k] },
                    value: function (u, y, si, x) { return x === null || y === null ? "\u2014" : fmt(err[at[x]]); } });
    });
    if (!xs.length) { el("p", { "class": "muted" }, "no measured pair to draw", chartBox); body.setAttribute("data-chart-points", "0"); return; }
    var decades = function () {
      var a = Math.round(Math.log10(floor)), b = Math.round(Math.log10(ceil)), step = Math.max(1, Math.ceil((b - a) / 8)), out = [];
      for (var e = a; e <= b; e += step) { out.push(Math.pow(10, e)); }
      return out;
    };
    var w = Math.max(480, Math.min(1400, (chartBox.clientWidth || 960) - 4));
    var u = new uPlot({ width: w, height: 280, scales: { x: { time: false }, y: { distr: 3, range: function () { return [floor, ceil]; } } },
                        axes: [{ label: "pair, in execution order" }, { label: "relative error", size: 70, splits: decades, values: function (u, vals) { return vals.map(function (x) { return x === null ? "" : x.toExponential(0); }); } }],
                        series: series }, data, chartBox);
    body.setAttribute("data-chart-points", String(points));
    Promise.resolve().then(function () {
      var canvas = chartBox.querySelector("canvas");
      body.setAttribute("data-chart-size", canvas ? canvas.width + "x" + canvas.height : "0x0");
      if (location.hash.indexOf("hover") < 0) { return; }
      var pick = 0; for (i = 0; i < at.length; i++) { if (verdict[at[i]] === "culprit") { pick = i; break; } }
      var over = u.root.querySelector(".u-over"), rect = over.getBoundingClientRect();
      over.dispatchEvent(new MouseEvent("mousemove", { clientX: rect.left + u.valToPos(pick, "x"), clientY: rect.top + rect.height / 2, bubbles: true }));
      body.setAttribute("data-hover", Array.prototype.map.call(u.root.querySelectorAll(".u-legend .u-series"), function (row) {
        return row.querySelector(".u-label").textContent + "=" + row.querySelector(".u-value").textContent;
      }).join("; "));
    });
  })();

  // -- culprits and the selected one -------------------------------------------------------------
  el("h2", null, "First divergence and culprits", body);
  var culprits = S.culprits || [];
  var panel = el("div", { "class": "panel", id: "culprit" }, null, body);
  if (!culprits.length) { el("p", null, "No culprit: nothing diverged beyond what the number formats explain.", panel); }
  var list = el("ol", { "class": "culprit-list" }, null, body);
  culprits.slice(0, 50).forEach(function (f, i) {
    var li = el("li", null, f.kind + ": " + where(f) + "  (error " + fmt(f.metrics.error) + ", " + fmt(f.score) + "\u00d7 allowed)", list);
    li.addEventListener("click", function () { showFinding(f); });
  });
  function tensorTable(title, rows, parent) {
    el("h3", null, title, parent);
    var t = el("table", null, null, parent), tr = el("tr", null, null, t);
    ["io", "slot", "arg", "param", "dtype", "shape", "error", "cosine", "status", "from"].forEach(function (c) { el("th", null, c, tr); });
    rows.forEach(function (r) {
      var row = el("tr", { "class": "s-" + r.status }, null, t);
      [r.io, r.slot, r.arg, r.param, r.dtype, "[" + (r.shape || []).join(", ") + "]", fmt(r.error), fmt(r.cosine), r.status, r.producer_op].forEach(function (v) { el("td", null, v === null || v === undefined ? "" : v, row); });
    });
  }
  function showFinding(f) {
    while (panel.firstChild) { panel.removeChild(panel.firstChild); }
    var first = S.first_divergence;
    el("b", null, (first && f.seq === first.seq && f.step === first.step && f.rank === first.rank ? "First divergence \u2014 " : "") + f.kind, panel);
    el("div", { "class": "mono" }, where(f), panel);
    el("div", null, "error " + fmt(f.metrics.error) + " (allowed " + fmt(f.metrics.tolerance) + ", inputs " + fmt(f.metrics.input_error) +
      "), cosine " + fmt(f.metrics.cosine) + ", max abs " + fmt(f.metrics.max_abs) + ", SNR " + fmt(f.metrics.snr_db) + " dB", panel);
    if (f.source) { el("div", { "class": "mono" }, "source: " + f.source, panel); }
    if (f.note) { el("div", { "class": "muted" }, f.note, panel); }
    tensorTable("Inputs", f.inputs || [], panel);
    tensorTable("Outputs", f.outputs || [], panel);
    el("h3", null, "Data-flow neighbourhood", panel);
    drawFlow(f, panel);
  }
  function drawFlow(f, parent) {
    var up = f.upstream || [], down = f.downstream || [], rows = Math.max(up.length, down.length, 1);
    var height = Math.max(80, rows * 34 + 20);
    var svg = sv("svg", { id: "flow", viewBox: "0 0 960 " + height, style: "height:" + height + "px" }, parent);
    function box(x, y, label, sub, cls) {
      var g = sv("g", { "class": "node " + cls }, svg);
      sv("rect", { x: x, y: y, width: 290, height: 28, rx: 4 }, g);
      var t = sv("text", { x: x + 6, y: y + 12 }, g); t.textContent = label;
      var s = sv("text", { x: x + 6, y: y + 24, fill: "#666" }, g); s.textContent = sub;
      return g;
    }
    var cy = height / 2 - 14;
    box(335, cy, (f.kind === "root" && f.param ? f.param : f.op), f.module || "(top level)", "focus");
    up.forEach(function (u, i) {
      var y = 10 + i * 34; sv("path", { "class": "edge", d: "M290 " + (y + 14) + " C312 " + (y + 14) + " 312 " + (cy + 14) + " 335 " + (cy + 14) }, svg);
      box(0, y, u.op, (u.module || "(top level)") + " \u00b7 " + u.status + " " + fmt(u.error), u.status === "failed" ? "bad" : "");
    });
    down.forEach(function (d, i) {
      var y = 10 + i * 34; sv("path", { "class": "edge", d: "M625 " + (cy + 14) + " C647 " + (cy + 14) + " 647 " + (y + 14) + " 670 " + (y + 14) }, svg);
      box(670, y, d.op, (d.module || "(top level)") + " \u00b7 " + d.status + " " + fmt(d.error), d.status === "failed" ? "bad" : "");
    });
  }
  if (S.first_divergence) { showFinding(S.first_divergence); } else if (culprits.length) { showFinding(culprits[0]); }

  // -- the table: sortable, filterable ---------------------------------------------------------
  el("h2", null, "Pairs", body);
  if (P.truncated) { el("p", { "class": "muted" }, "Showing " + N + " of " + P.total + " pairs (every failed and unpaired one); pairs.csv has all.", body); }
  var controls = el("div", { "class": "controls" }, null, body);
  var filter = el("input", { type: "search", id: "filter", placeholder: "filter: module, op, param, dtype..." }, null, controls);
  var statusSel = el("select", { id: "status" }, null, controls);
  ["", "culprit", "root", "failed", "passed", "identical", "unpaired", "skipped"].forEach(function (s) { el("option", { value: s }, s || "any status", statusSel); });
  var shown = el("span", { "class": "muted", id: "shown" }, "", controls);
  var wrap = el("div", { id: "table-wrap" }, null, body);
  var table = el("table", { id: "pairs" }, null, wrap);
  var cols = Object.keys(C), head = el("tr", null, null, el("thead", null, null, table)), tbody = el("tbody", null, null, table);
  var order = [], i;
  for (i = 0; i < N; i++) { order.push(i); }
  var sortCol = null, sortDir = 1, LIMIT = 1000;
  cols.forEach(function (c) {
    var th = el("th", { "data-col": c }, c, head);
    th.addEventListener("click", function () { sortDir = sortCol === c ? -sortDir : 1; sortCol = c; sortBy(c); render(); });
  });
  var text = []; for (i = 0; i < N; i++) { text.push(cols.map(function (c) { var v = C[c][i]; return v === null ? "" : String(v); }).join(" ").toLowerCase()); }
  function sortBy(c) {
    var v = C[c], numeric = ["error", "tolerance", "input_error", "rel_l2", "cosine", "max_abs", "snr_db", "order", "step", "rank", "slot", "call"].indexOf(c) >= 0;
    order.sort(function (a, b) {
      var x = numeric ? num(v[a]) : String(v[a] === null ? "" : v[a]), y = numeric ? num(v[b]) : String(v[b] === null ? "" : v[b]);
      if (numeric) { if (isNaN(x)) { return 1; } if (isNaN(y)) { return -1; } return (x - y) * sortDir || a - b; }
      return (x < y ? -1 : x > y ? 1 : a - b) * sortDir;
    });
    Array.prototype.forEach.call(head.children, function (th) { th.className = th.getAttribute("data-col") === c ? (sortDir > 0 ? "sorted-asc" : "sorted-desc") : ""; });
  }
  function matches(k, q, st) {
    if (st) { if (st === "culprit" || st === "root") { if (C.verdict[k] !== st) { return false; } } else if (C.status[k] !== st) { return false; } }
    return !q || text[k].indexOf(q) >= 0;
  }
  function render() {
    var q = filter.value.trim().toLowerCase(), st = statusSel.value, count = 0, frag = document.createDocumentFragment();
    while (tbody.firstChild) { tbody.removeChild(tbody.firstChild); }
    order.forEach(function (k) {
      if (!matches(k, q, st)) { return; }
      count++;
      if (count > LIMIT) { return; }
      var tr = el("tr", { "class": "s-" + C.status[k] + " v-" + (C.verdict[k] || "none") }, null, frag);
      cols.forEach(function (c) { var v = C[c][k]; el("td", null, typeof v === "number" && !Number.isInteger(v) ? fmt(v) : (v === null ? "" : v), tr); });
    });
    tbody.appendChild(frag);
    shown.textContent = count + " of " + N + " rows" + (count > LIMIT ? " (first " + LIMIT + " shown)" : "");
    body.setAttribute("data-rows-visible", String(count));
  }
  filter.addEventListener("input", render);
  statusSel.addEventListener("change", render);
  var params = new URLSearchParams((location.hash || "").replace(/^#/, ""));
  if (params.get("filter")) { filter.value = params.get("filter"); }
  if (params.get("status")) { statusSel.value = params.get("status"); }
  render();
  body.setAttribute("data-ready", "1");
})();
