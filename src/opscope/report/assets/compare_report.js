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
  if (S.problems && S.problems.length) {
    var det = el("details", null, null, body); el("summary", null, S.problems.length + " thing(s) skipped", det);
    var ul = el("ul", null, null, det); S.problems.forEach(function (p) { el("li", null, p, ul); });
  }

  // -- chart: error along the execution order -----------------------------------------------
  el("h2", null, "Error along the execution order", body);
  el("div", { "class": "muted" }, "relative error (log scale) of every measured pair; red: culprit, purple: root, orange: inherited failure", body);
  var chart = sv("svg", { id: "chart", viewBox: "0 0 1000 260", preserveAspectRatio: "none" }, body);
  var points = 0;
  (function drawChart() {
    var err = C.error || [], status = C.status || [], verdict = C.verdict || [];
    var lo = Infinity, hi = -Infinity, i, y;
    for (i = 0; i < N; i++) { y = num(err[i]); if (y > 0 && isFinite(y)) { y = Math.log10(y); lo = Math.min(lo, y); hi = Math.max(hi, y); } }
    if (!isFinite(lo)) { lo = -8; hi = 0; }
    if (hi - lo < 1) { hi = lo + 1; }
    var paths = {}, cls, x, yy, v;
    for (i = 0; i < N; i++) {
      v = num(err[i]);
      if (isNaN(v) || status[i] === "unpaired" || status[i] === "skipped") { continue; }
      cls = verdict[i] === "culprit" || verdict[i] === "root" ? verdict[i] : (status[i] || "passed");
      x = 20 + 960 * (N > 1 ? i / (N - 1) : 0.5);
      yy = v <= 0 ? 250 : (!isFinite(v) ? 6 : 245 - 230 * (Math.log10(v) - lo) / (hi - lo));
      paths[cls] = (paths[cls] || "") + "M" + x.toFixed(1) + " " + yy.toFixed(1) + "h3v3h-3z";
      points++;
    }
    ["identical", "passed", "failed", "root", "culprit"].forEach(function (k) { if (paths[k]) { sv("path", { d: paths[k], "class": "p-" + k }, chart); } });
    var t = sv("text", { x: 4, y: 14, "font-size": 11 }, chart); t.textContent = "1e" + hi.toFixed(0);
    t = sv("text", { x: 4, y: 244, "font-size": 11 }, chart); t.textContent = "1e" + lo.toFixed(0);
    body.setAttribute("data-chart-points", String(points));
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
