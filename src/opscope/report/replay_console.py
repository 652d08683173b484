"""Text of a replay (``opscope replay``): where, verdict, reason, one line per side."""

from __future__ import annotations

import math
from typing import Any

from opscope.report import register_renderer


@register_renderer("ReplayResult", "text")
def render(result: Any) -> str:
    """The replay as plain text: where, verdict, reason, one line per side."""
    lines = [f"replay {result.id}: {result.where}",
             f"verdict: {result.verdict_text}",
             f"  {result.reason}"]
    sides = [s for s in (result.target, result.reference) if s is not None]
    if sides:
        lines.append(f"  {'side':<10} {'dtype':<9} {'local error':>12} {'eps':>9} {'allowed':>8} "
                     f"{'CPU kernel':>11}  status")
        for s in sides:
            repro = " (same bits)" if s.reproduced else ""
            lines.append(f"  {s.side:<10} {s.dtype:<9} {_fmt(s.error):>12} {_fmt(s.units):>9} "
                         f"{_fmt(s.allowed_units):>8} {_fmt(s.native_units):>11}  {s.status.replace('_', '-')}{repro}")
        lines += [f"  note ({s.side}): {s.note}" for s in sides if s.note]
        owner = "TensorFlow's" if sides[0].op.startswith("tf.") else "torch's"
        lines.append("  (local error: against the op re-run in float64 on that side's own inputs; "
                     f"CPU kernel: {owner}, in the recorded dtypes, in eps)")
    return "\n".join(lines) + "\n"


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    try:
        v = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(v) or math.isinf(v):
        return str(v)
    if v == 0:
        return "0"
    return f"{v:.3g}" if 0.01 <= abs(v) < 1e5 else f"{v:.2e}"
