"""Self-contained offline HTML report of a monitor run: ``render(data) -> str``.

Loss and learning rate over steps, a tensor x step heat map of gradient norms (log10,
each row scaled to its own range so that a layer's own jump shows), the steps of events
marked on every chart, hover with values. No network: inline SVG drawn by inline
JavaScript from a JSON block in which ``<``, ``>`` and ``&`` are escaped; names reach the
page only as text nodes, so a module called ``</script>...`` stays text.
"""

from __future__ import annotations

import html
import json
import math
import re
from typing import TYPE_CHECKING, Any

from opscope.report import register_renderer
from opscope.report.monitor_console import render_event

if TYPE_CHECKING:
    from opscope.monitor.events import MonitorData, RankSeries

MAX_STEPS = 1500
MAX_ROWS = 200


def _num(v: float) -> float | None:
    return v if isinstance(v, float) and math.isfinite(v) or isinstance(v, int) else None


def _line(r: RankSeries, kind: str, name: str, stride: int) -> dict[str, Any] | None:
    got = r.values.get((kind, name, "value"))
    if not got:
        return None
    steps, vals = got
    return {"name": name, "steps": steps[::stride], "values": [_num(v) for v in vals[::stride]]}


def _heat(r: RankSeries, stride: int) -> dict[str, Any]:
    names = r.series("grad")[:MAX_ROWS]
    steps = sorted({s for n in names for s in r.values[("grad", n, "norm")][0]})[::stride]
    where = {s: i for i, s in enumerate(steps)}
    rows = []
    for n in names:
        cells: list[float | None] = [None] * len(steps)
        for s, v in zip(*r.values[("grad", n, "norm")], strict=True):
            if s in where:
                cells[where[s]] = math.log10(v) if v > 0 and math.isfinite(v) else None
        rows.append({"name": n, "cells": cells})
    return {"steps": steps, "rows": rows}


def _payload(data: MonitorData) -> dict[str, Any]:
    ranks = []
    for rank in sorted(data.ranks):
        r = data.ranks[rank]
        stride = max(1, math.ceil(r.steps / MAX_STEPS))
        lines = [x for x in (_line(r, "loss", "loss", stride), *(_line(r, "lr", n, stride) for n in r.series("lr",
                 "value"))) if x is not None]
        ranks.append({"rank": rank, "lines": lines, "heat": _heat(r, stride), "stride": stride,
                      "events": [{"step": e.step, "text": render_event(e)} for e in r.events]})
    return {"ranks": ranks}


def _script_json(obj: Any) -> str:
    text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


@register_renderer("MonitorData", "html")
def render(data: MonitorData) -> str:
    """The whole page for a :class:`~opscope.monitor.events.MonitorData`."""
    events = "".join(f"<li>{html.escape(render_event(e))}</li>" for e in data.events) or "<li>nothing moved</li>"
    parts = {"@TITLE@": html.escape(f"opscope monitor: {data.path}"), "@EVENTS@": events,
             "@DATA@": _script_json(_payload(data))}
    return re.sub("@TITLE@|@EVENTS@|@DATA@", lambda m: parts[m.group(0)], _PAGE)


_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>@TITLE@</title>
<style>
body{font:13px system-ui,sans-serif;margin:16px;color:#222}h1{font-size:18px}h2{font-size:15px;margin-top:18px}
svg{background:#fff;border:1px solid #ddd}#tip{position:fixed;pointer-events:none;background:#222;color:#fff;
padding:3px 6px;border-radius:3px;font-size:12px;display:none;white-space:pre}
.ev{stroke:#d62728;stroke-width:1.5;stroke-dasharray:4 2}
</style></head>
<body>
<h1>@TITLE@</h1>
<h2>Events (earliest tensor that moved first)</h2><ul id="events">@EVENTS@</ul>
<div id="charts"></div><div id="tip"></div>
<script id="data" type="application/json">@DATA@</script>
<script>
(function(){
const NS="http://www.w3.org/2000/svg",body=document.body,tip=document.getElementById("tip");
function el(tag,attrs,parent){const e=document.createElementNS(NS,tag);for(const k in attrs)e.setAttribute(k,attrs[k]);
 if(parent)parent.appendChild(e);return e;}
function hover(e,text){e.addEventListener("mousemove",ev=>{tip.style.display="block";tip.textContent=text;
 tip.style.left=(ev.clientX+12)+"px";tip.style.top=(ev.clientY+12)+"px";});
 e.addEventListener("mouseleave",()=>{tip.style.display="none";});}
function fmt(v){return v===null?"n/a":Math.abs(v)>=1e4||Math.abs(v)<1e-3&&v!==0?v.toExponential(3):v.toPrecision(4);}
let points=0,cells=0,marks=0;
function lineChart(parent,line,events,logy){
 const W=720,H=160,L=60,B=20,svg=el("svg",{width:W,height:H},parent);
 const xs=line.steps,ys=line.values.map(v=>v===null?null:(logy?Math.log10(Math.max(v,1e-30)):v));
 const ok=ys.filter(v=>v!==null);if(!ok.length)return;
 let lo=Math.min(...ok),hi=Math.max(...ok);if(hi===lo){hi+=1;lo-=1;}
 const x0=xs[0],x1=Math.max(xs[xs.length-1],x0+1);
 const X=s=>L+(W-L-10)*(s-x0)/(x1-x0),Y=v=>H-B-(H-B-10)*(v-lo)/(hi-lo);
 let d="";xs.forEach((s,i)=>{if(ys[i]!==null)d+=(d?"L":"M")+X(s).toFixed(1)+","+Y(ys[i]).toFixed(1);});
 el("path",{d:d,fill:"none",stroke:"#1f77b4","stroke-width":1.5},svg);
 xs.forEach((s,i)=>{if(ys[i]===null)return;const c=el("circle",{cx:X(s),cy:Y(ys[i]),r:2.5,fill:"#1f77b4"},svg);
  hover(c,line.name+"  step "+s+"\\n"+fmt(line.values[i]));points++;});
 events.forEach(e=>{if(e.step>=x0&&e.step<=x1){el("line",{x1:X(e.step),x2:X(e.step),y1:10,y2:H-B,class:"ev"},svg);marks++;}});
 const t=el("text",{x:4,y:14,"font-size":11},svg);t.textContent=line.name+(logy?" (log10)":"");
 const a=el("text",{x:4,y:H-4,"font-size":10},svg);a.textContent="steps "+x0+".."+xs[xs.length-1];}
function heat(parent,h,events){
 if(!h.rows.length)return;const n=h.steps.length,cw=Math.max(2,Math.min(14,Math.floor(900/Math.max(n,1)))),ch=12,L=220;
 const svg=el("svg",{width:L+cw*n+10,height:ch*h.rows.length+30},parent);
 h.rows.forEach((row,i)=>{const ok=row.cells.filter(v=>v!==null);const lo=Math.min(...ok),hi=Math.max(...ok);
  const t=el("text",{x:2,y:i*ch+10,"font-size":10},svg);t.textContent=row.name;
  row.cells.forEach((v,j)=>{const f=v===null?0:(hi>lo?(v-lo)/(hi-lo):0.5);
   const fill=v===null?"#000":"hsl("+(240-240*f).toFixed(0)+",80%,50%)";
   const r=el("rect",{x:L+j*cw,y:i*ch,width:cw,height:ch-1,fill:fill},svg);
   hover(r,row.name+"  step "+h.steps[j]+"\\ngrad norm "+(v===null?"NaN/Inf or none":fmt(Math.pow(10,v))));
   cells++;});});
 events.forEach(e=>{const j=h.steps.indexOf(e.step);if(j>=0){el("rect",{x:L+j*cw,y:0,width:cw,height:ch*h.rows.length,
  fill:"none",stroke:"#d62728","stroke-width":2},svg);marks++;}});
 const a=el("text",{x:L,y:ch*h.rows.length+22,"font-size":10},svg);
 a.textContent="gradient norm per tensor (rows: earliest in backward first; each row coloured on its own log range)";}
try{
 const data=JSON.parse(document.getElementById("data").textContent),root=document.getElementById("charts");
 data.ranks.forEach(r=>{const h=document.createElement("h2");h.textContent="rank "+r.rank+
  (r.stride>1?" (every "+r.stride+"th step shown)":"");root.appendChild(h);
  const div=document.createElement("div");root.appendChild(div);
  r.lines.forEach(line=>lineChart(div,line,r.events,line.name!=="loss"));
  const hd=document.createElement("div");root.appendChild(hd);heat(hd,r.heat,r.events);});
 body.setAttribute("data-chart","ok");body.setAttribute("data-points",points);
 body.setAttribute("data-cells",cells);body.setAttribute("data-marks",marks);
}catch(err){body.setAttribute("data-error",String(err));}
})();
</script></body></html>
"""
