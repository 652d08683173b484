"""Terminal renderings of a profile and of a profile diff: pure ``render_*(x) -> str``."""

from __future__ import annotations

import io
from typing import Any

from opscope.profile.model import PHASES
from opscope.report import register_renderer


def _console(width: int) -> Any:
    from rich.console import Console

    return Console(file=io.StringIO(), width=width, force_terminal=False, color_system=None, highlight=False)


def _text(console: Any) -> str:
    return console.file.getvalue()


@register_renderer("ProfileData", "text")
def render_show(data: Any, top: int = 10, width: int = 110) -> str:
    """``opscope profile show``: status, step time, phases, slowest ranks, top ops, warnings."""
    from rich.table import Table

    s = data.summary
    con = _console(width)
    steps = s.get("steps", {})
    step_ms = s.get("step_ms", {})
    con.print(f"opscope profile {data.path}  status: {data.status}  ranks: {', '.join(map(str, s.get('ranks', [])))}")
    con.print(
        f"steps: {steps.get('recorded', 0)} recorded, {steps.get('steady', 0)} steady (after "
        f"{steps.get('warmup', 0)} warm-up, "
        f"without task trace), {steps.get('task_traced', 0)} task-traced"
    )
    if step_ms.get("n"):
        con.print(f"step time: median {step_ms['median']:.3f} ms  (p10 {step_ms['p10']:.3f}, p90 {step_ms['p90']:.3f}, "
                  f"MAD {step_ms['mad']:.3f})")
    load = s.get("machine_load") or {}
    if load.get("note"):
        con.print(load["note"])
    table = Table(title="phases (steady steps)", title_justify="left")
    for col in ("phase", "median ms", "mean ms", "share", ""):
        table.add_column(col, justify="left" if col in ("phase", "") else "right")
    for phase in PHASES:
        row = s.get("phases", {}).get(phase, {})
        share = row.get("share", 0.0)
        table.add_row(phase, f"{row.get('median_ms', 0):.3f}", f"{row.get('mean_ms', 0):.3f}", f"{share * 100:.1f}%",
                      "#" * round(share * 40))
    con.print(table)
    _outliers(con, s.get("outliers") or {})
    comm = s.get("communication", {})
    if comm.get("total_ms", {}).get("median"):
        con.print(f"communication: median {comm['total_ms']['median']:.3f} ms per step, of which "
                  f"{comm['overlap_ms'].get('median', 0):.3f} ms hidden under other phases")
    _slowest(con, s.get("slowest_ranks", {}))
    _ops(con, s.get("top_ops", [])[:top])
    _task_cost(con, s.get("task_trace", {}))
    for warning in data.warnings:
        con.print(f"warning: {warning}")
    return _text(con)


def _outliers(con: Any, outliers: dict[str, Any]) -> None:
    """Which steps make a mean differ from its median."""
    steps = outliers.get("steps") or []
    if not steps:
        return
    ranks = len({o["rank"] for o in steps}) > 1
    shown = "; ".join(f"step {o['step']}" + (f" rank {o['rank']}" if ranks else "")
                      + f" {o['wall_ms']:.3f} ms ({o['phase']} {o['phase_ms']:.3f} ms)" for o in steps[:5])
    more = f" and {len(steps) - 5} more" if len(steps) > 5 else ""
    con.print(f"outlier steps (above {outliers['threshold_ms']:.3f} ms; they make a mean exceed its median): "
              f"{shown}{more}")


def _task_cost(con: Any, task: dict[str, Any]) -> None:
    if not task.get("ratio"):
        return
    line = (f"task trace cost: profiled steps take {task['ratio']:.2f}x the unprofiled ones "
            f"(median {task['traced_median_ms']:.3f} vs {task['plain_median_ms']:.3f} ms)")
    if task.get("why"):
        line += f"; below 1x: {task['why']}"
    elif task["ratio"] < 1:  # a summary from an older opscope: no reason recorded
        line += "; below 1x: noise or a busier machine during the unprofiled steps, not a speed-up"
    con.print(line)


def _slowest(con: Any, slow: dict[str, Any]) -> None:
    if not slow.get("steps"):
        return
    counts = ", ".join(f"rank {r}: {n}" for r, n in sorted(slow["counts"].items(), key=lambda kv: -kv[1]))
    con.print(f"slowest rank per step: {counts}")
    worst = sorted(slow["steps"], key=lambda x: -x["behind_ms"])[:5]
    con.print("  most behind: " + "; ".join(f"step {w['step']} rank {w['rank']} +{w['behind_ms']:.3f} ms"
                                            for w in worst))


def _ops(con: Any, ops: list[dict[str, Any]]) -> None:
    from rich.table import Table

    if not ops:
        con.print("no task trace: run with task_trace=True to list operators")
        return
    table = Table(title="top operators (task-traced steps)", title_justify="left")
    for col in ("op", "phase", "calls", "self ms/step", "total ms", "device ms", "shapes"):
        table.add_column(col, justify="right" if "ms" in col or col == "calls" else "left", overflow="fold")
    for op in ops:
        table.add_row(op["name"], op["phase"], str(op["calls"]), f"{op['self_us_per_step'] / 1000:.3f}",
                      f"{op['total_us'] / 1000:.3f}", f"{op['device_us'] / 1000:.3f}", op["shapes"][:40])
    con.print(table)


@register_renderer("ProfileDiff", "text")
def render_diff(result: Any, top: int = 10, width: int = 110) -> str:
    """``opscope profile diff``: headlines, the phase table and the largest op changes."""
    from rich.table import Table

    con = _console(width)
    con.print(f"A: {result.a}\nB: {result.b}")
    for line in result.findings:
        con.print(f"* {line}")
    table = Table(title=f"phases, B against A (median over steps; noise = {result.k:g} x robust spread)",
                  title_justify="left")
    for col in ("phase", "A ms", "B ms", "delta ms", "delta %", "noise ms", "verdict"):
        table.add_column(col, justify="left" if col in ("phase", "verdict") else "right")
    for c in result.phases:
        table.add_row(c.name, f"{c.a_ms:.3f}", f"{c.b_ms:.3f}", f"{c.delta_ms:+.3f}", _pct(c.relative),
                      f"{c.noise_ms:.3f}", c.direction)
    con.print(table)
    shown = [c for c in result.ops if c.flagged][:top] or result.ops[: min(top, 5)]
    if shown:
        ops = Table(title="operators (self time per task-traced step)", title_justify="left")
        for col in ("op", "phase", "A ms", "B ms", "delta ms", "delta %", "noise ms", "verdict"):
            ops.add_column(col, justify="left" if col in ("op", "phase", "verdict") else "right", overflow="fold")
        for c in shown:
            ops.add_row(c.name, c.phase, f"{c.a_ms:.3f}", f"{c.b_ms:.3f}", f"{c.delta_ms:+.3f}", _pct(c.relative),
                        f"{c.noise_ms:.3f}", c.direction)
        con.print(ops)
    for note in result.notes:
        con.print(f"note: {note}")
    return _text(con)


def _pct(relative: float | None) -> str:
    return "n/a" if relative is None else f"{relative * 100:+.1f}%"
