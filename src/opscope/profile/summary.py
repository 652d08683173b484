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
            {"name": op.name, "shapes": op.shapes, "calls": 0, "total_us": 0.0, "self_us": 0.0, "device_us": 0.0,
             "_steps": set(), "_phases": {}},
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
    steps: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
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


LOADED_SHARE = 0.05  # run-queue wait above this share of the step time is said next to the figures


def task_trace_overhead(rows: Sequence[StepRow], warmup: int = 1) -> dict[str, Any]:
    """Profiled steps against unprofiled steps of the same run (median wall time ratio),
    also without the time the training thread waited for a CPU; ``why`` says what a ratio
    below 1 means (it is never a speed-up from profiling)."""
    traced_rows = [r for r in rows if r.task_trace and r.complete]
    plain_rows = [r for r in steady_steps(rows, warmup) if not r.task_trace]
    if not traced_rows or not plain_rows:
        why = "no profiled step" if not traced_rows else "no unprofiled step to compare with"
        return {"ratio": None, "why": why, "traced_steps": len(traced_rows)}
    traced = statistics.median(r.wall_ns for r in traced_rows) / MS
    plain = statistics.median(r.wall_ns for r in plain_rows) / MS
    traced_wait = statistics.median(r.sched_wait_ns for r in traced_rows) / MS
    plain_wait = statistics.median(r.sched_wait_ns for r in plain_rows) / MS
    out: dict[str, Any] = {"ratio": round(traced / plain, 4), "traced_median_ms": round(traced, 4),
                           "plain_median_ms": round(plain, 4), "traced_steps": len(traced_rows),
                           "traced_wait_ms": round(traced_wait, 4), "plain_wait_ms": round(plain_wait, 4)}
    if traced - traced_wait > 0 and plain - plain_wait > 0 and (traced_wait or plain_wait):
        out["ratio_without_wait"] = round((traced - traced_wait) / (plain - plain_wait), 4)
    if traced < plain:
        out["why"] = _below_one(out, plain_rows)
    return out


def _below_one(cost: dict[str, Any], plain_rows: Sequence[StepRow]) -> str:
    """Why profiled steps came out faster than unprofiled ones."""
    plain_wait, traced_wait = cost["plain_wait_ms"], cost["traced_wait_ms"]
    if plain_wait - traced_wait > 0.5 * (cost["plain_median_ms"] - cost["traced_median_ms"]):
        without = cost.get("ratio_without_wait")
        return (f"the unprofiled steps waited longer for a CPU ({plain_wait:.3f} ms per step, median, against "
                f"{traced_wait:.3f} ms): the machine was busier during them"
                + (f"; without the wait the cost is {without:.2f}x" if without else ""))
    walls = sorted(r.wall_ns / MS for r in plain_rows)
    return (f"within the spread of the unprofiled steps (p10 {_quantile(walls, 0.1):.3f} to p90 "
            f"{_quantile(walls, 0.9):.3f} ms) with {cost['traced_steps']} profiled step(s): profiling "
            "does not make a step faster; record more task-traced steps for a cost")


def outlier_steps(rows: Sequence[StepRow], limit: int = 20) -> dict[str, Any]:
    """Steps far slower than the rest: wall time above median + 5 robust deviations
    (1.4826 MAD) and above 1.5x the median. Each names the phase that grew most against its
    median, so a mean far above the median is explained by the steps that made it."""
    if len(rows) < 3:
        return {"threshold_ms": None, "steps": []}
    walls = [r.wall_ns for r in rows]
    median = statistics.median(walls)
    mad = statistics.median(abs(w - median) for w in walls)
    threshold = max(median + 5 * 1.4826 * mad, 1.5 * median)
    medians = {p: statistics.median(r.phases.get(p, 0) for r in rows) for p in PHASES}
    found = []
    for r in sorted((r for r in rows if r.wall_ns > threshold), key=lambda r: -r.wall_ns)[:limit]:
        phase = max(PHASES, key=lambda p: r.phases.get(p, 0) - medians[p])
        found.append({"step": r.step, "rank": r.rank, "wall_ms": round(r.wall_ns / MS, 4), "phase": phase,
                      "phase_ms": round(r.phases.get(phase, 0) / MS, 4), "wait_ms": round(r.sched_wait_ns / MS, 4)})
    return {"threshold_ms": round(threshold / MS, 4), "steps": found}


def machine_load(rows: Sequence[StepRow]) -> dict[str, Any]:
    """How much of the steady steps' time the training thread spent waiting for a CPU
    (Linux run-queue wait): ``loaded`` when it is at least 5% of the step time, with the
    phase that waited most; ``note`` is the line reports print next to the figures."""
    wall = sum(r.wall_ns for r in rows)
    wait = sum(r.sched_wait_ns for r in rows)
    if not rows or not wall:
        return {"loaded": False, "share": 0.0, "note": None}
    share = wait / wall
    out: dict[str, Any] = {"loaded": share >= LOADED_SHARE, "share": round(share, 4),
                           "wait_ms_per_step": round(wait / len(rows) / MS, 4), "note": None}
    waits = {p: sum(max(0, (r.phase_waits or {}).get(p, 0)) for r in rows) for p in PHASES}
    worst = max(waits, key=lambda p: waits[p])
    if waits[worst] > 0:
        out["phase"] = worst
        out["phase_wait_ms_per_step"] = round(waits[worst] / len(rows) / MS, 4)
    if out["loaded"]:
        where = f", most in {worst} ({out['phase_wait_ms_per_step']:.3f} ms)" if "phase" in out else ""
        out["note"] = (f"machine loaded: the training thread waited for a CPU {out['wait_ms_per_step']:.3f} ms per "
                       f"step ({share * 100:.0f}% of step time{where}); these times include that wait, so they "
                       "overstate what the code takes (opscope profile diff takes it out)")
    return out


def summarize(rows: Sequence[StepRow], ops: Sequence[OpRow], warmup: int = 1, top: int = 20) -> dict[str, Any]:
    """The measured part of ``summary.json`` for any set of ranks."""
    ranks = sorted({r.rank for r in rows})
    steady = steady_steps(rows, warmup)
    per_rank = {}
    for rank in ranks:
        mine = steady_steps([r for r in rows if r.rank == rank], warmup)
        per_rank[str(rank)] = {"steps": sum(1 for r in rows if r.rank == rank),
                               "step_ms": describe([r.wall_ns / MS for r in mine])}
    return {
        "ranks": ranks,
        "steps": {"recorded": len(rows), "complete": sum(r.complete for r in rows), "steady": len(steady),
                  "warmup": warmup, "task_traced": sum(r.task_trace for r in rows)},
        "step_ms": describe([r.wall_ns / MS for r in steady]),
        "phases": phase_table(steady),
        "communication": {"total_ms": describe([r.comm_total_ns / MS for r in steady]),
                          "overlap_ms": describe([r.comm_overlap_ns / MS for r in steady])},
        "sched_wait_ms": describe([r.sched_wait_ns / MS for r in steady]),
        "machine_load": machine_load(steady),
        "outliers": outlier_steps(steady),
        "per_rank": per_rank,
        "slowest_ranks": slowest_ranks(rows),
        "task_trace": task_trace_overhead(rows, warmup),
        "top_ops": aggregate_ops(ops)[:top],
    }
