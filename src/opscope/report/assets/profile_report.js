/* opscope profile report: charts drawn with uPlot from the JSON block; every time in ms.
   Sets on <body>: data-chart ("ok" when drawn), data-charts (charts drawn), data-points
   (step-time points), data-bars (bars of the rank shown), data-ranks; with #hover in the URL
   it moves the cursor over the step chart as a mouse would and writes the legend's values
   to data-hover (the tests read these from the DOM). */
(function () {
  "use strict";
  var body = document.body;
  window.addEventListener("error", function (e) { body.setAttribute("data-error", String(e.message)); });
  var D = JSON.parse(document.getElementById("opscope-data").textContent);
  var RANK_COLORS = ["#1f77b4", "#9467bd", "#2ca02c", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"];
  var charts = [];

  function ms(v) { return v === null || v === undefined ? "\u2014" : v.toFixed(3) + " ms"; }
  function width(el) { return Math.max(480, Math.min(1100, (el.parentNode.clientWidth || 960) - 8)); }
  function yFromZero(u, min, max) { return [0, max > 0 ? max * 1.08 : 1]; }
  function msAxis(label) {
    return { label: label, size: 64, values: function (u, vals) { return vals.map(function (v) { return v === null ? "" : +v.toFixed(3) + ""; }); } };
  }

  // -- step time: one line per rank, outliers and task-traced steps marked ---------------------
  function stepChart(el) {
    var steps = {};
    D.ranks.forEach(function (r) { D.series[r].step.forEach(function (s) { steps[s] = 1; }); });
    var xs = Object.keys(steps).map(Number).sort(function (a, b) { return a - b; });
    var at = {}; xs.forEach(function (s, i) { at[s] = i; });
    var data = [xs], series = [{ label: "step", value: function (u, v) { return v === null ? "\u2014" : "step " + v; } }];
    var points = 0;
    D.ranks.forEach(function (r, k) {
      var y = xs.map(function () { return null; }), S = D.series[r];
      S.step.forEach(function (s, i) { y[at[s]] = S.wall[i]; points++; });
      data.push(y);
      series.push({ label: "rank " + r, stroke: RANK_COLORS[k % RANK_COLORS.length], width: 1.5, value: function (u, v) { return ms(v); },
                    points: { show: true, size: 4 } });
    });
    // Markers: per rank, its task-traced steps (orange rings) and its outlier steps (red).
    var none = function () { return null; }, multi = D.ranks.length > 1;
    var marker = function (label, y, color, size, fill) {
      if (!y.some(function (v) { return v !== null; })) { return; }
      data.push(y);
      series.push({ label: label, stroke: color, paths: none, value: function (u, v) { return ms(v); },
                    points: { show: true, size: size, width: 2, fill: fill, stroke: color } });
    };
    D.ranks.forEach(function (r) {
      var S = D.series[r], traced = xs.map(function () { return null; }), outl = xs.map(function () { return null; });
      S.step.forEach(function (s, i) { if (S.traced[i]) { traced[at[s]] = S.wall[i]; } });
      D.outliers.forEach(function (o) {
        var i = String(o.rank) === String(r) ? S.step.indexOf(o.step) : -1;
        if (i >= 0) { outl[at[o.step]] = S.wall[i]; }
      });
      marker("task-traced" + (multi ? " (rank " + r + ")" : ""), traced, "#ff7f0e", 9, "rgba(0,0,0,0)");
      marker("outlier" + (multi ? " (rank " + r + ")" : ""), outl, "#d62728", 12, "rgba(214,39,40,0.35)");
    });
    body.setAttribute("data-points", String(points));
    return new uPlot({ width: width(el), height: 280, scales: { x: { time: false }, y: { range: yFromZero } },
                       axes: [{ label: "step" }, msAxis("step time (ms)")], series: series }, data, el);
  }

  // -- phases stacked as bars: drawn tallest first, each bar from 0 to its running sum ---------
  function stacked(el, labels, xs, phases, xLabel, xValue) {
    var order = D.phases.slice().reverse(), sums = {}, run = xs.map(function () { return 0; });
    D.phases.forEach(function (p) { run = run.map(function (v, i) { return v + (phases[p][i] || 0); }); sums[p] = run.slice(); });
    var data = [xs], series = [{ label: xLabel, value: function (u, v) { return v === null ? "\u2014" : xValue(v); } }];
    var bars = uPlot.paths.bars({ size: [0.8, 60], align: 0 });
    order.forEach(function (p) {
      if (!phases[p].some(function (v) { return v > 0; })) { return; }
      data.push(sums[p]);
      series.push({ label: p, stroke: D.colors[p], fill: D.colors[p], width: 0, paths: bars, points: { show: false },
                    value: (function (raw) { return function (u, v, si, i) { return i === null || i === undefined ? "\u2014" : ms(raw[i]); }; })(phases[p]) });
    });
    var u = new uPlot({ width: width(el), height: 280, scales: { x: { time: false, range: function (u, min, max) { return [min - 0.6, max + 0.6]; } }, y: { range: yFromZero } },
                        axes: [{ label: xLabel, values: function (u, vals) { return vals.map(function (v) { return Number.isInteger(v) ? xValue(v) : ""; }); } },
                               msAxis("time (ms)")],
                        series: series, cursor: { points: { show: false } } }, data, el);
    u.opscopeBars = (series.length - 1) * xs.length;
    return u;
  }

  function phaseChart(el, rank) {
    var S = D.series[rank];
    var u = stacked(el, D.phases, S.step, S.phases, "step", function (v) { return String(v); });
    body.setAttribute("data-bars", String(u.opscopeBars));
    return u;
  }

  function probeHover(u, step) {
    var over = u.root.querySelector(".u-over"), rect = over.getBoundingClientRect();
    var x = u.valToPos(step, "x"), y = rect.height / 2;
    over.dispatchEvent(new MouseEvent("mousemove", { clientX: rect.left + x, clientY: rect.top + y, bubbles: true }));
    var values = Array.prototype.map.call(u.root.querySelectorAll(".u-legend .u-series"), function (row) {
      var label = row.querySelector(".u-label"), value = row.querySelector(".u-value");
      return (label ? label.textContent : "") + "=" + (value ? value.textContent : "");
    });
    body.setAttribute("data-hover", values.join("; "));
  }

  if (D.ranks.length && document.getElementById("steps-chart")) {
    var stepsChart = stepChart(document.getElementById("steps-chart"));
    charts.push(stepsChart);
    var select = document.getElementById("rank"), holder = document.getElementById("phases-chart"), current = null;
    D.ranks.forEach(function (r) { var o = document.createElement("option"); o.value = r; o.textContent = r; select.appendChild(o); });
    var draw = function () { if (current) { current.destroy(); } current = phaseChart(holder, select.value); };
    select.addEventListener("change", draw);
    draw();
    charts.push(current);
    var ranksEl = document.getElementById("ranks-chart");
    if (D.per_rank && ranksEl) {
      charts.push(stacked(ranksEl, D.phases, D.ranks, D.per_rank, "rank", function (v) { return "rank " + v; }));
    }
  }
  // uPlot lays a chart out in a microtask after it is made: read sizes and hover after that.
  Promise.resolve().then(function () {
    if (charts.length && location.hash.indexOf("hover") >= 0) {
      var S0 = D.series[D.ranks[0]];
      probeHover(charts[0], S0.step[Math.floor(S0.step.length / 2)]);
    }
    body.setAttribute("data-charts", String(charts.length));
    body.setAttribute("data-canvas", Array.prototype.map.call(document.querySelectorAll(".chart canvas"), function (c) { return c.width + "x" + c.height; }).join(" "));
    body.setAttribute("data-ranks", String(D.ranks.length));
    body.setAttribute("data-chart", "ok");
  });
})();
