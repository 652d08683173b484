"""The text of one ``opscope.watch`` hit: op, module, phase, step, rank, source, inputs, chain.

Pure: ``render(event) -> str``. The first line alone names the op, module, phase and step
(it is what a log line or an exception's first line shows).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from opscope.report import register_renderer

if TYPE_CHECKING:
    from opscope.watch.events import OverflowEvent, TensorSummary

_WHAT = {
    "nan": "NaN",
    "inf": "Inf",
    "-inf": "-Inf",
    "limit": "values beyond the limit",
    "loss_spike": "a loss spike",
    "time_spike": "a step-time spike",
}


def headline(event: OverflowEvent) -> str:
    """One line: what, where (op, module, phase, step, rank)."""
    module = event.module or "(top level)"
    where = f"module {module}, {event.phase}, step {event.step}, rank {event.rank}"
    if event.op.startswith("<") and event.kind.endswith("spike"):
        return f"opscope.watch: {_WHAT[event.kind]} at step {event.step} (rank {event.rank})"
    subject = event.op if not event.param else f"{event.op} {event.param}"
    return f"opscope.watch: {_WHAT.get(event.kind, event.kind)} in {subject} ({where})"


@register_renderer("OverflowEvent", "text")
def render(event: OverflowEvent) -> str:
    """The full message for a hit, as plain text."""
    lines = [headline(event)]
    if event.detail:
        lines.append(f"  detail   {event.detail}")
    if event.shape is not None or event.nan is not None:
        counts = ""
        if event.nan is not None:
            counts = f": {event.nan} NaN, {event.inf} Inf"
        lines.append(f"  output   {event.dtype or '?'} {_shape(event.shape)}{counts}, "
                     f"range {_num(event.min)} .. {_num(event.max)}")
    if event.limit is not None:
        lines.append(f"  limit    |x| <= {_num(event.limit)}")
    if event.fwd_op or event.node:
        lines.append(f"  backward of {event.fwd_op or '?'} (autograd node {event.node or '?'})")
    if event.source:
        lines.append(f"  source   {event.source}")
    for i, t in enumerate(event.inputs):
        lines.append(("  inputs   " if i == 0 else "           ") + _tensor(t))
    if event.chain:
        lines.append("  chain    (earliest abnormal output first)")
        for i, link in enumerate(event.chain):
            arrow = "    " if i == 0 else " -> "
            where = link.module or "(top level)"
            rng = f", range {_num(link.min)} .. {_num(link.max)}" if link.min is not None else ""
            lines.append(f"         {arrow}{link.op} in {where} ({link.phase}): {link.reason}{rng}")
        origin = event.chain[0]
        if len(event.chain) > 1:
            lines.append(f"  -> start looking at {origin.op} in {origin.module or '(top level)'}")
    return "\n".join(lines)


def _tensor(t: TensorSummary) -> str:
    name = f"{t.slot} {t.name}" if t.name else str(t.slot)
    parts = [f"{name:<12s}", f"{t.dtype or '?'} {_shape(t.shape)}"]
    if t.min is not None or t.max is not None:
        parts.append(f"min {_num(t.min)} max {_num(t.max)}")
    if t.mean is not None:
        parts.append(f"mean {_num(t.mean)} std {_num(t.std)}")
    if t.nan is not None:
        parts.append(f"nan {t.nan} inf {t.inf} zeros {t.zeros}")
    if t.origin:
        parts.append(f"from {t.origin}")
    return "  ".join(parts)


def _shape(shape: list[int] | None) -> str:
    return "[?]" if shape is None else "[" + ", ".join(str(s) for s in shape) + "]"


def _num(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return f"{v:.4g}"
