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
    quick = _disjoint_inside(start, end, intervals)
    if quick is not None:
        return quick, quick["communication"], 0
    clipped = {p: clip(intervals.get(p, ()), start, end) for p in PRIORITY}
    active = [p for p in PRIORITY if clipped[p]]
    result = dict.fromkeys(PHASES, 0)
    comm_total = union_length(clipped["communication"])
    if _disjoint(clipped, active):
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


def _disjoint_inside(start: int, end: int, intervals: Mapping[str, Sequence[Interval]]) -> dict[str, int] | None:
    """The usual step, in one pass: every interval inside ``[start, end]`` and none
    overlapping another, so each phase is just its total. None: take the general path.

    This runs once per step on the training thread (twice with the wait split), so it
    builds one list and one dict, where the general path builds a dozen.
    """
    get = intervals.get
    flat = [(lo, hi, phase) for phase in PRIORITY for lo, hi in get(phase) or ()]
    result = dict.fromkeys(PHASES, 0)
    flat.sort()
    cursor = start
    for lo, hi, phase in flat:
        if lo < cursor or hi < lo:
            return None
        result[phase] += hi - lo
        cursor = hi
    if cursor > end:
        return None
    result["other"] = end - start - sum(result.values())
    return result


def _covered(intervals: Sequence[Interval], lo: int, hi: int) -> bool:
    return any(a <= lo and hi <= b for a, b in intervals)


def _disjoint(clipped: Mapping[str, Sequence[Interval]], active: Sequence[str]) -> bool:
    flat = sorted(iv for p in active for iv in clipped[p])
    return all(a[1] <= b[0] for a, b in zip(flat, flat[1:]))
