"""Exclusive phase breakdown of one step: pure interval arithmetic, no torch.

Every instant of a step goes to exactly one phase: the first active phase in
:data:`~opscope.profile.model.PRIORITY`, else ``other``. So the phases plus ``other`` add up
to the wall time exactly, and a collective that runs under backward is counted once (as
backward) and reported as overlap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from opscope.profile.model import PHASES, PRIORITY, Interval


def clip(intervals: Sequence[Interval], start: int, end: int) -> list[Interval]:
    """Intervals cut to ``[start, end]``; empty ones dropped."""
    out = []
    for lo, hi in intervals:
        lo, hi = max(lo, start), min(hi, end)
        if hi > lo:
            out.append((lo, hi))
    return out


def union_length(intervals: Sequence[Interval]) -> int:
    """Total length covered by possibly overlapping intervals."""
    total, cursor = 0, None
    for lo, hi in sorted(intervals):
        if cursor is None or lo >= cursor:
            total += hi - lo
            cursor = hi
        elif hi > cursor:
            total += hi - cursor
            cursor = hi
    return total


def breakdown(start: int, end: int, intervals: Mapping[str, Sequence[Interval]]) -> tuple[dict[str, int], int, int]:
    """Split ``[start, end]`` into exclusive phases.

    Args:
        start: step start (ns).
        end: step end (ns).
        intervals: phase name -> intervals in ns (may overlap, may stick out of the step).

    Returns:
        (phase -> ns for every name in PHASES, communication total ns, communication ns
        hidden under another phase).
    """
    clipped = {p: clip(intervals.get(p, ()), start, end) for p in PRIORITY}
    active = [p for p in PRIORITY if clipped[p]]
    result = dict.fromkeys(PHASES, 0)
    comm_total = union_length(clipped["communication"])
    if _disjoint(clipped, active):
        # The usual step: nothing overlaps, so each phase is just its total.
        for phase in active:
            result[phase] = sum(hi - lo for lo, hi in clipped[phase])
        result["other"] = end - start - sum(result.values())
        return result, comm_total, 0
    points = sorted({start, end, *(t for p in active for iv in clipped[p] for t in iv)})
    overlap = 0
    for lo, hi in zip(points, points[1:]):
        owner = "other"
        for phase in active:
            if any(a <= lo and hi <= b for a, b in clipped[phase]):
                owner = phase
                break
        result[owner] += hi - lo
        if owner != "communication" and owner != "other" and _covered(clipped["communication"], lo, hi):
            overlap += hi - lo
    return result, comm_total, overlap


def _covered(intervals: Sequence[Interval], lo: int, hi: int) -> bool:
    return any(a <= lo and hi <= b for a, b in intervals)


def _disjoint(clipped: Mapping[str, Sequence[Interval]], active: Sequence[str]) -> bool:
    flat = sorted(iv for p in active for iv in clipped[p])
    return all(a[1] <= b[0] for a, b in zip(flat, flat[1:]))
