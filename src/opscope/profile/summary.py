"""Summaries of step rows and op rows: pure functions, no torch, no printing.

One schema for a single rank and for a merged run: a merged summary adds the slowest rank
per step. Statistics use the *steady* steps: complete, outside the task trace, after the
first ``warmup`` steps (falling back to whatever steps exist when that leaves none).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from opscope.profile.model import PHASES, OpRow, StepRow

MS = 1e6


def describe(values_ms: Sequence[float]) -> dict[str, float]:
    """Median, MAD, mean, min, max, p10, p90 and count of a series (ms)."""
    if not values_ms:
        return {"n": 0}
    ordered = sorted(values_ms)
    median = statistics.median(ordered)
    mad = statistics.median([abs(v - median) for v in ordered])
    return {
        "n": len(ordered),
        "median": round(median, 4),
        "mad": round(mad, 4),
        "mean": round(statistics.fmean(ordered), 4),
        "min": round(ordered[0], 4),
        "max": round(ordered[-1], 4),
        "p10": round(_quantile(ordered, 0.1), 4),
        "p90": round(_quantile(ordered, 0.9), 4),
    }


def _quantile(ordered: Sequence[float], q: float) -> float:
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def steady_steps(rows: Iterable[StepRow], warmup: int = 1) -> list[StepRow]:
    """The steps statistics are computed over (see module docstring)."""
    rows = list(rows)
    complete = [r for r in rows if r.complete]
    steady = [r for r in complete if not r.task_trace and r.step >= warmup]
    return steady or [r for r in complete if not r.task_trace] or complete or rows


def phase_table(rows: Sequence[StepRow]) -> dict[str, dict[str, float]]:
    """Per phase: median and mean ms, and share of the mean wall time."""
    wall = sum(r.wall_ns for r in rows) or 1
    table = {}
    for phase in PHASES:
        values = [r.phases.get(phase, 0) / MS for r in rows]
        table[phase] = {
            "median_ms": round(statistics.median(values), 4) if values else 0.0,
            "mean_ms": round(statistics.fmean(values), 4) if values else 0.0,
            "share": round(sum(r.phases.get(phase, 0) for r in rows) / wall, 4),
        }
    return table


def aggregate_ops(ops: Iterable[OpRow]) -> list[dict[str, Any]]:
    """Ops summed over steps, phases and ranks by (name, shapes), largest self time first."""
    table: dict[tuple[str, str], dict[str, Any]] = {}
    for op in ops:
        entry = table.setdefault(
            (op.name, op.shapes),
            {"name": op.name, "shapes": op.shapes, "calls": 0, "total_us": 0.0, "self_us": 0.0, "device_us": 0.0, "_steps": set(), "_phases": {}},
        )
        entry["calls"] += op.calls
        entry["total_us"] += op.total_us
        entry["self_us"] += op.self_us
        entry["device_us"] += op.device_us
        entry["_steps"].add((op.rank, op.step))
        entry["_phases"][op.phase] = entry["_phases"].get(op.phase, 0.0) + op.self_us
    out = []
    for entry in table.values():
        steps = entry.pop("_steps")
        phases = entry.pop("_phases")
        entry["steps"] = len(steps)
        entry["self_us_per_step"] = round(entry["self_us"] / max(len(steps), 1), 3)
        entry["phase"] = max(phases, key=phases.get)
        for key in ("total_us", "self_us", "device_us"):
            entry[key] = round(entry[key], 3)
        out.append(entry)
    out.sort(key=lambda e: (-(e["device_us"] or e["self_us"]), e["name"]))
    return out


def busy_ns(row: StepRow) -> int:
    """Step time not spent waiting in exposed communication."""
    return row.wall_ns - row.phases.get("communication", 0)


def slowest_ranks(rows: Iterable[StepRow], limit: int = 2000) -> dict[str, Any]:
    """Per step (with more than one rank): the rank the others waited for.

    Collectives make every rank's wall time about equal, the fast ranks waiting in
    communication; so ranks are ranked by *busy* time (wall minus exposed communication).
    """
    by_step: dict[int, list[StepRow]] = {}
    for row in rows:
        if row.complete:
            by_step.setdefault(row.step, []).append(row)
    steps, counts = [], {}
    for step in sorted(by_step):
        group = by_step[step]
        if len(group) < 2:
            continue
        worst = max(group, key=busy_ns)
        median = statistics.median(busy_ns(r) for r in group) / MS
        counts[str(worst.rank)] = counts.get(str(worst.rank), 0) + 1
        steps.append(
            {
                "step": step,
                "rank": worst.rank,
                "wall_ms": round(worst.wall_ns / MS, 4),
                "busy_ms": round(busy_ns(worst) / MS, 4),
                "median_busy_ms": round(median, 4),
                "behind_ms": round(busy_ns(worst) / MS - median, 4),
            }
        )
    return {"counts": counts, "steps": steps[:limit]}


def task_trace_overhead(rows: Sequence[StepRow], warmup: int = 1) -> dict[str, Any]:
    """Profiled steps against unprofiled steps of the same run (median wall time ratio)."""
    traced = [r.wall_ns / MS for r in rows if r.task_trace and r.complete]
    plain = [r.wall_ns / MS for r in steady_steps(rows, warmup) if not r.task_trace]
    if not traced or not plain:
        why = "no profiled step" if not traced else "no unprofiled step to compare with"
        return {"ratio": None, "why": why, "traced_steps": len(traced)}
    ratio = statistics.median(traced) / statistics.median(plain)
    return {"ratio": round(ratio, 4), "traced_median_ms": round(statistics.median(traced), 4), "plain_median_ms": round(statistics.median(plain), 4), "traced_steps": len(traced)}


def summarize(rows: Sequence[StepRow], ops: Sequence[OpRow], warmup: int = 1, top: int = 20) -> dict[str, Any]:
    """The measured part of ``summary.json`` for any set of ranks."""
    ranks = sorted({r.rank for r in rows})
    steady = steady_steps(rows, warmup)
    per_rank = {}
    for rank in ranks:
        mine = steady_steps([r for r in rows if r.rank == rank], warmup)
        per_rank[str(rank)] = {"steps": sum(1 for r in rows if r.rank == rank), "step_ms": describe([r.wall_ns / MS for r in mine])}
    return {
        "ranks": ranks,
        "steps": {"recorded": len(rows), "complete": sum(r.complete for r in rows), "steady": len(steady), "warmup": warmup, "task_traced": sum(r.task_trace for r in rows)},
        "step_ms": describe([r.wall_ns / MS for r in steady]),
        "phases": phase_table(steady),
        "communication": {"total_ms": describe([r.comm_total_ns / MS for r in steady]), "overlap_ms": describe([r.comm_overlap_ns / MS for r in steady])},
        "sched_wait_ms": describe([r.sched_wait_ns / MS for r in steady]),
        "per_rank": per_rank,
        "slowest_ranks": slowest_ranks(rows),
        "task_trace": task_trace_overhead(rows, warmup),
        "top_ops": aggregate_ops(ops)[:top],
    }
