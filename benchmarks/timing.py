"""Timing shared by the benchmarks: interleaved runs, so machine noise hits both sides alike; the
statistics kernel's own time in dumped steps (the floor under a dump's ratio)."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from typing import Any


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


def native_dump() -> Any:
    """The native dump module (None where it cannot be built: no kernel clock to read)."""
    try:
        from opscope.capture.torch.native import build

        return build.load("_opscope_dump")
    except Exception:
        return None


class KernelSteps:
    """The native dump's kernel clock over a loop of dumped steps: ``steps`` gets each step's
    (seconds, bytes) of the statistics kernel, between :meth:`begin` and :meth:`end`; nothing
    where ``on`` is false (a bare loop) or the native module is not built. Entered inside the
    dump, so that the clock runs only over its steps."""

    def __init__(self, on: bool = True) -> None:
        self.native = native_dump() if on else None
        self.steps: list[tuple[float, int]] = []
        self._start = (0.0, 0)

    def __enter__(self) -> KernelSteps:
        if self.native is not None:
            self.native.kernel_clock(True)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.native is not None:
            self.native.kernel_clock(False)

    def begin(self) -> None:
        if self.native is not None:
            self._start = (self.native.kernel_seconds(), self.native.read_bytes())

    def end(self) -> None:
        if self.native is not None:
            k0, b0 = self._start
            self.steps.append((self.native.kernel_seconds() - k0, self.native.read_bytes() - b0))


def floor_text(kernel: list[tuple[float, int]], bare_step: float) -> str:
    """The statistics kernel's share of the dumped steps against the bare step: the ratio a dump
    whose only cost was reading each new tensor once would have (issue 18's floor)."""
    if not kernel:
        return "the native dump's kernel clock is not available"
    seconds = statistics.median(k for k, _ in kernel)
    mb = statistics.median(b for _, b in kernel) / 1e6
    rate = mb / 1e3 / seconds if seconds > 0 else float("nan")
    return (f"the statistics kernel in the step: {mb:.1f} MB at {rate:.1f} GB/s, {seconds * 1e3:.2f} ms a step, "
            f"alone {1 + seconds / bare_step:.2f}x of the bare step")


def host_text() -> str:
    """The CPU the figures were measured on (ratios move with it: the kernel's rate, the caches):
    its model, the cores this process may use, the L2 of one core, the statistics kernel's loops."""
    model, l2 = "unknown CPU", "?"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
        with open("/sys/devices/system/cpu/cpu0/cache/index2/size") as f:
            l2 = f.read().strip()
    except OSError:
        pass
    try:
        from opscope.capture.torch.stats import _fastats

        simd = getattr(_fastats, "SIMD_PATH", "avx2 or portable") if _fastats is not None else "not built"
    except ImportError:
        simd = "not built"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}, {cores} cores, L2 {l2} a core, statistics kernel {simd}"
