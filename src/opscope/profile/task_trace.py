"""Task trace: torch.profiler for the chosen steps only, streamed step by step.

The profiler is started at the boundary into a chosen step and stopped at its end, so steps
outside the window run with no profiler at all, and memory holds one step's events at a
time: each step's events go straight to the trace file and into per-op totals.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from opscope.profile.chrome_trace import TID_STREAM_BASE, TraceWriter, span
from opscope.profile.model import PRIORITY, Interval, OpRow

TID_CPU_BASE = 100  # kineto numbers host threads from 1: keep clear of opscope's tracks


class TaskTrace:
    """Runs ``torch.profiler`` for single steps and turns each into trace events and op rows.

    Args:
        writer: the rank's trace file.
        rank: this process's rank (the trace's pid).
        origin_ns: host ``perf_counter_ns`` of the session start (trace time zero).
        record_shapes / with_stack: passed to ``torch.profiler.profile``.
    """

    def __init__(self, writer: TraceWriter, rank: int, origin_ns: int, record_shapes: bool = False,
                 with_stack: bool = False) -> None:
        self.writer = writer
        self.rank = rank
        self.origin_ns = origin_ns
        self.record_shapes = record_shapes
        self.with_stack = with_stack
        self.op_rows: list[OpRow] = []
        self.steps: list[int] = []
        self.export_ns = 0
        self._profiler: Any = None
        self._offset_ns = 0

    @property
    def running(self) -> bool:
        """Whether the profiler is on now."""
        return self._profiler is not None

    def begin(self) -> None:
        """Start the profiler (at a boundary, before the step's start mark)."""
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            activities.append(ProfilerActivity.CUDA)
        t0 = time.perf_counter_ns()
        self._profiler = profile(activities=activities, record_shapes=self.record_shapes, with_stack=self.with_stack)
        with kineto_quiet():
            self._profiler.start()
        self._offset_ns = time.time_ns() - time.perf_counter_ns()
        self.export_ns += time.perf_counter_ns() - t0

    def end(self, step: int, phases: Mapping[str, Sequence[Interval]]) -> None:
        """Stop the profiler after ``step``; stream its events, attribute ops to ``phases`` (host ns)."""
        t0 = time.perf_counter_ns()
        profiler, self._profiler = self._profiler, None
        with kineto_quiet():
            profiler.stop()
        events = profiler.profiler.kineto_results.events()
        self.op_rows.extend(self._consume(step, events, phases))
        self.writer.flush()  # each traced step reaches the disk: memory stays bounded, a crash keeps it
        self.steps.append(step)
        self.export_ns += time.perf_counter_ns() - t0

    def abort(self) -> None:
        """Stop a running profiler and drop its events (the step did not finish)."""
        profiler, self._profiler = self._profiler, None
        if profiler is not None:
            with contextlib.suppress(Exception):  # already stopped by torch on the error path
                profiler.stop()

    def _consume(self, step: int, events: Sequence[Any], phases: Mapping[str, Sequence[Interval]]) -> list[OpRow]:
        cpu: dict[int, list[list[Any]]] = {}
        by_corr: dict[int, list[Any]] = {}
        kernels = []
        for event in events:
            if event.device_type().name == "CPU":
                start = event.start_ns() - self._offset_ns
                item = [start, start + event.duration_ns(), event, 0, 0.0]
                cpu.setdefault(event.start_thread_id(), []).append(item)
                by_corr[event.correlation_id()] = item
            else:
                kernels.append(event)
        for kernel in kernels:
            owner = by_corr.get(kernel.linked_correlation_id())
            if owner is not None:
                owner[4] += kernel.duration_ns() / 1000.0
            self._write_kernel(kernel)
        totals: dict[tuple[str, str, str], list[float]] = {}
        for tid, items in cpu.items():
            self_times(items)
            self.writer.name_thread(self.rank, TID_CPU_BASE + tid, f"CPU thread {tid}", TID_CPU_BASE + tid)
            for start, end, event, child_ns, device_us in items:
                shapes = str(event.shapes()) if self.record_shapes else ""
                self._write_cpu(event, start, end, tid, shapes)
                key = (phase_at((start + end) // 2, phases), event.name(), shapes)
                acc = totals.setdefault(key, [0, 0.0, 0.0, 0.0])
                acc[0] += 1
                acc[1] += (end - start) / 1000.0
                acc[2] += max(0, end - start - child_ns) / 1000.0
                acc[3] += device_us
        return [
            OpRow(self.rank, step, phase, name, shapes, int(c), round(t, 3), round(s, 3), round(d, 3))
            for (phase, name, shapes), (c, t, s, d) in totals.items()
        ]

    def _write_cpu(self, event: Any, start: int, end: int, tid: int, shapes: str) -> None:
        args: dict[str, Any] = {}
        if shapes:
            args["shapes"] = shapes
        if self.with_stack:
            stack = event.stack()
            if stack:
                args["stack"] = list(stack)
        cat = event.activity_type() if hasattr(event, "activity_type") else "cpu_op"
        record = span(event.name(), self.rank, TID_CPU_BASE + tid, (start - self.origin_ns) / 1000,
                      (end - start) / 1000, args)
        record["cat"] = cat
        self.writer.event(record)

    def _write_kernel(self, kernel: Any) -> None:
        start = kernel.start_ns() - self._offset_ns
        stream = int(kernel.device_resource_id())
        tid = TID_STREAM_BASE + stream
        device = f"{kernel.device_type().name} {kernel.device_index()}"
        self.writer.name_thread(self.rank, tid, f"{device} stream {stream}", tid)
        record = span(kernel.name(), self.rank, tid, (start - self.origin_ns) / 1000, kernel.duration_ns() / 1000)
        record["cat"] = kernel.activity_type() if hasattr(kernel, "activity_type") else "kernel"
        self.writer.event(record)


@contextlib.contextmanager
def kineto_quiet() -> Iterator[None]:
    """Drop the ``USDT:... profiler_start/stop`` lines the profiler library prints to stderr
    at every start and stop (one pair per traced step); anything else it prints is kept."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real stderr (embedded interpreter): nothing to filter
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            kept = [line for line in sink.read().splitlines(keepends=True) if not line.startswith(b"USDT:")]
            if kept:
                os.write(2, b"".join(kept))


def self_times(items: list[list[Any]]) -> None:
    """Fill each item's child time (index 3) from nesting on one thread."""
    items.sort(key=lambda it: (it[0], -(it[1] - it[0])))
    stack: list[list[Any]] = []
    for item in items:
        while stack and stack[-1][1] <= item[0]:
            stack.pop()
        if stack:
            stack[-1][3] += item[1] - item[0]
        stack.append(item)


def phase_at(t: int, phases: Mapping[str, Sequence[Interval]]) -> str:
    """The phase that owns instant ``t`` (same priority as the breakdown)."""
    for phase in PRIORITY:
        for lo, hi in phases.get(phase, ()):
            if lo <= t < hi:
                return phase
    return "other"
