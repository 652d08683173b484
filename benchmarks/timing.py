"""Timing shared by the benchmarks: interleaved runs, so machine noise hits both sides alike."""

from __future__ import annotations

import statistics
from collections.abc import Callable


def interleaved_ratio(bare: Callable[[], list[float]], case: Callable[[], list[float]], rounds: int,
                      warmup: int = 2) -> float:
    """Median step time of ``case`` over that of ``bare``.

    Each callable runs a fresh loop and returns its step times; the first ``warmup`` steps
    of each run are dropped. The order alternates (bare then case, case then bare, ...):
    whichever runs second in a pair tends to be a little slower (allocator and cache state
    left by the first), and a fixed order would charge that to one side.
    """
    base, other = [], []
    for r in range(rounds):
        first, second = (bare, case) if r % 2 == 0 else (case, bare)
        times = {id(first): first()[warmup:], id(second): second()[warmup:]}
        base += times[id(bare)]
        other += times[id(case)]
    return statistics.median(other) / statistics.median(base)
