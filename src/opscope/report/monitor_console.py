"""Text of ``opscope.monitor``: one line per event, and the summary ``opscope monitor show`` prints.

Pure: ``render(event) -> str`` and ``render(data) -> str``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from opscope.report import register_renderer

if TYPE_CHECKING:
    from opscope.monitor.events import Departure, MonitorData, MonitorEvent


def _what(d: Departure) -> str:
    if d.stat == "zeros" or not math.isfinite(d.z):
        return d.reason
    unit = "" if d.stat == "value" else f"{d.stat} "
    return f"{unit}{d.value:.4g}, {_factor(d)} the median {d.median:.4g} (z={d.z:.0f})"


def _factor(d: Departure) -> str:
    f = d.factor
    if not math.isfinite(f) or f <= 0:
        return "against"
    return f"{f:.3g}x" if f >= 1 else f"1/{1 / f:.3g} of"


@register_renderer("MonitorEvent", "text")
def render_event(event: MonitorEvent) -> str:
    """One line: the step, the earliest tensor that moved and how, and how many others moved."""
    first = event.first
    others = len(event.departures) - 1
    tail = f"; then {others} more ({', '.join(d.label for d in event.departures[1:4])}" \
           f"{', ...' if others > 3 else ''})" if others else ""
    return f"opscope.monitor: step {event.step} (rank {event.rank}): {first.label} moved first: {_what(first)}{tail}"


def _origins(data: MonitorData) -> list[str]:
    """Under DDP: the steps where some ranks' own gradients (before the all-reduce) moved
    first, while the other ranks' did not: the trouble came from those ranks."""
    local: dict[int, list[tuple[int, str]]] = {}
    for rank, r in sorted(data.ranks.items()):
        for event in r.events:
            own = [d for d in event.departures if d.kind == "grad_local"]
            if own and event.first.kind == "grad_local":
                local.setdefault(event.step, []).append((rank, own[0].name))
    lines = []
    for step, found in sorted(local.items()):
        if len(found) < len(data.ranks):
            names = ", ".join(f"rank {rank} ({name})" for rank, name in found)
            lines.append(f"step {step}: own gradients moved before the all-reduce on {names} only: the trouble "
                         f"came from {'that rank' if len(found) == 1 else 'those ranks'}")
    return lines


@register_renderer("MonitorData", "text")
def render_data(data: MonitorData, top: int = 8) -> str:
    """The summary: what was followed, per rank, and each event with its earliest tensors."""
    lines = [f"monitor {data.path}"]
    targets = ", ".join(data.config.get("targets", []))
    for rank in sorted(data.ranks):
        r = data.ranks[rank]
        kinds = sorted({k for k, _, _ in r.values})
        count = len({(k, n) for k, n, _ in r.values})
        lines.append(f"rank {rank}: {r.steps} steps, {count} series ({', '.join(kinds) or 'none'}), {r.status}")
        if not r.events:
            lines.append("  nothing moved out of its band")
        for event in r.events:
            lines.append(f"  step {event.step}: {len(event.departures)} series moved; earliest first:")
            lines += [f"    {d.label}: {_what(d)}" for d in event.departures[:top]]
            if len(event.departures) > top:
                lines.append(f"    ... {len(event.departures) - top} more")
    if not data.ranks:
        lines.append("no rank wrote anything (ranks/enable in the config?)")
    lines += _origins(data)
    report = Path(data.path) / "report.html"
    lines.append(f"targets: {targets or '?'}" + (f"; report: {report}" if report.is_file() else
                                                  "; no report.html (written at stop unless report=False)"))
    return "\n".join(lines)
