"""Task trace for TensorFlow: TensorFlow's profiler for the chosen steps, one step at a time.

``tf.profiler.experimental.start`` at the boundary into a chosen step and ``stop`` at its
end; ``stop`` writes an ``.xplane.pb`` (an XSpace protobuf), which is read here with the
protobuf classes TensorFlow itself ships (``tensorflow.tsl.profiler.protobuf.xplane_pb2``),
turned into trace events and per-op rows, and deleted. The executor's own bookkeeping
events (thread-pool regions, allocations) are left out.
"""

from __future__ import annotations

import bisect
import contextlib
import re
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from opscope.profile.chrome_trace import TID_STREAM_BASE, TraceWriter, span
from opscope.profile.model import OpRow
from opscope.profile.task_trace import TID_CPU_BASE, phase_at, self_times
from opscope.profile.tensorflow_phases import StepWindow

NOISE = frozenset(
    {
        "ThreadpoolListener::StartRegion",
        "ThreadpoolListener::StopRegion",
        "ThreadpoolListener::Record",
        "ExecutorState::Process",
        "ExecutorState::ProcessAsync::Done",
        "MemoryAllocation",
        "MemoryDeallocation",
        "TFE_DeleteTensorHandle",
        "ValidateInputTypeAndPlacement",
    }
)
# Wrappers around a whole function run on the calling thread (its ops run on the executor's
# threads, so nesting cannot take them out of the wrapper's self time): drawn in the trace,
# left out of the ops tables.
WRAPPERS = frozenset(
    {
        "KernelAndDeviceFunc::Run",
        "FunctionRun",
        "TFE_Py_ExecuteCancelable",
        "EagerExecute",
        "EagerKernelExecute",
        "EagerCopyToDevice",
        "TFE_Py_FastPathExecute_C",
        "EagerLocalExecute",
    }
)
# tf.data's threads (its iterator's consumer and producer, its map functions' thread pool): their
# work feeds the step's input however much of the step it overlaps, so it is the data phase's
# (a slow input pipeline's ops are named under data_wait, never under backward).
INPUT_THREADS = ("tf_data_",)
_CALL_PREFIX = re.compile(r"^.*?(?:^|/)(?:Stateful)?PartitionedCall(?:_\d+)?/(?!.*PartitionedCall(?:_\d+)?/)")
LOGDIR = ".tf_profiler"  # inside the rank folder while a step is traced; removed after


class TFTaskTrace:
    """Runs TensorFlow's profiler for single steps; each step becomes trace events and op rows.

    Args:
        writer: the rank's trace file.
        rank: this process's rank (the trace's pid).
        origin_ns: host ``perf_counter_ns`` of the session start (trace time zero).
        folder: the rank folder (the profiler's temporary output goes under it).
    """

    def __init__(self, writer: TraceWriter, rank: int, origin_ns: int, folder: Path) -> None:
        self.writer = writer
        self.rank = rank
        self.origin_ns = origin_ns
        self.logdir = folder / LOGDIR
        self.op_rows: list[OpRow] = []
        self.steps: list[int] = []
        self.export_ns = 0
        self._running = False
        self._stopped = False  # stopped after a traced step; its trace not read yet
        self._failure = ""  # why the profiler could not write that trace
        self._tids: dict[str, int] = {}

    @property
    def running(self) -> bool:
        """Whether the profiler is on now."""
        return self._running

    def begin(self) -> None:
        """Start TensorFlow's profiler (at a boundary, before the step's start mark)."""
        import tensorflow as tf

        t0 = time.perf_counter_ns()
        shutil.rmtree(self.logdir, ignore_errors=True)
        options = tf.profiler.experimental.ProfilerOptions(
            host_tracer_level=2, python_tracer_level=0, device_tracer_level=1
        )
        tf.profiler.experimental.start(str(self.logdir), options=options)
        self._running = True
        self.export_ns += time.perf_counter_ns() - t0

    def stop(self) -> None:
        """Stop the profiler at a traced step's end, before opscope's own work there (reading
        the phase marks: TensorFlow ops too, which would be listed as the step's)."""
        import tensorflow as tf

        if not self._running:
            return
        t0 = time.perf_counter_ns()
        self._running = False
        try:
            tf.profiler.experimental.stop()
            self._stopped = True
        except Exception as exc:  # it could not write its trace (a full disk): never the training's error
            shutil.rmtree(self.logdir, ignore_errors=True)
            self._failure = str(exc)
        self.export_ns += time.perf_counter_ns() - t0

    def end(self, windows: Sequence[StepWindow]) -> None:
        """After :meth:`stop`: write the step's events and attribute each op to the window
        (``(step, start, end, phases)``, host ns: one per batch of a call that ran several)
        its middle falls in (the first or last when outside) and to a phase there."""
        self.stop()
        stopped, failure = self._stopped, self._failure
        self._stopped, self._failure = False, ""
        steps = [w[0] for w in windows]
        if failure:
            self.writer.failed = self.writer.failed or OSError(
                f"TensorFlow's profiler could not write the task trace of step(s) {steps}: {failure}")
            return
        if not stopped:
            return
        t0 = time.perf_counter_ns()
        offset = time.time_ns() - time.perf_counter_ns()
        try:
            for path in sorted(self.logdir.glob("plugins/profile/*/*.xplane.pb")):
                self.op_rows.extend(self._consume(windows, read_xspace(path), offset))
        finally:
            shutil.rmtree(self.logdir, ignore_errors=True)
        self.writer.flush()
        self.steps.extend(steps)
        self.export_ns += time.perf_counter_ns() - t0

    def abort(self) -> None:
        """Stop a running profiler and drop what it recorded (the step did not finish)."""
        if self._stopped or self._failure:  # stopped, never read
            self._stopped, self._failure = False, ""
            shutil.rmtree(self.logdir, ignore_errors=True)
        if not self._running:
            return
        self._running = False
        import tensorflow as tf

        with contextlib.suppress(Exception):  # already stopped (the profiler ends itself on some errors)
            tf.profiler.experimental.stop(save=False)
        shutil.rmtree(self.logdir, ignore_errors=True)

    def _consume(self, windows: Sequence[StepWindow], space: Any,
                 offset: int) -> list[OpRow]:
        totals: dict[tuple[int, str, str], list[float]] = {}
        cuts = [w[2] for w in windows[:-1]]
        for plane, line, items in _lines(space, offset):
            tid = self._tid(plane.name, line)
            feeds = line.name.startswith(INPUT_THREADS)
            self_times(items)
            for start, end, name, child in items:
                record = span(name, self.rank, tid, (start - self.origin_ns) / 1000, (end - start) / 1000)
                record["cat"] = "tf_op" if ":" in name else "tf"
                self.writer.event(record)
                if name in WRAPPERS or _is_function_call(plane, line, name):
                    continue
                middle = (start + end) // 2
                step, _, _, phases = windows[bisect.bisect_left(cuts, middle)]
                phase = "data_wait" if feeds else phase_at(middle, phases)
                acc = totals.setdefault((step, phase, name), [0, 0.0, 0.0])
                acc[0] += 1
                acc[1] += (end - start) / 1000.0
                acc[2] += max(0, end - start - child) / 1000.0
        return [
            OpRow(self.rank, step, phase, name, "", int(c), round(t, 3), round(s, 3))
            for (step, phase, name), (c, t, s) in totals.items()
        ]

    def _tid(self, plane: str, line: Any) -> int:
        key = f"{plane}|{line.name}"
        tid = self._tids.get(key)
        if tid is None:
            device = not plane.startswith("/host")
            tid = (TID_STREAM_BASE if device else TID_CPU_BASE) + len(self._tids)
            self._tids[key] = tid
            label = line.display_name or line.name
            self.writer.name_thread(
                self.rank, tid, f"{plane} {label}" if device else f"TF {label.split('/')[0]} {tid - TID_CPU_BASE}", tid
            )
        return tid


def read_xspace(path: Path) -> Any:
    """The XSpace protobuf in ``path`` (TensorFlow's own protobuf classes)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(path.read_bytes())
    return space


def _lines(space: Any, offset: int) -> Iterator[tuple[Any, Any, list[list[Any]]]]:
    """Per thread (line) of the host and device planes, its events as ``[start, end, name,
    0]`` in host ``perf_counter`` ns (``offset``: Unix ns minus perf_counter ns)."""
    base = _start_time(space)
    for plane in space.planes:
        if not (plane.name.startswith("/host:") or plane.name.startswith("/device:")):
            continue
        names = {k: _CALL_PREFIX.sub("", m.name) for k, m in plane.event_metadata.items()}
        for line in plane.lines:
            origin = base + line.timestamp_ns - offset
            items = []
            for event in line.events:
                name = names.get(event.metadata_id, "")
                if event.duration_ps <= 0 or not name or name in NOISE:
                    continue
                start = origin + event.offset_ps // 1000
                items.append([start, start + event.duration_ps // 1000, name, 0])
            if items:
                yield plane, line, items


def _start_time(space: Any) -> int:
    """Unix ns that the planes' line timestamps count from: the session's start time when
    the profiler normalised them (TF 2.x writes ``profile_start_time`` on its task plane),
    else 0 (absolute)."""
    for plane in space.planes:
        for stat in plane.stats:
            if plane.stat_metadata[stat.metadata_id].name == "profile_start_time":
                value = stat.uint64_value or stat.int64_value
                first = min((ln.timestamp_ns for p in space.planes for ln in p.lines), default=0)
                return int(value) if first < value // 2 else 0
    return 0


def _is_function_call(plane: Any, line: Any, name: str) -> bool:
    """A tf.function's own run on the Python thread (named after the function)."""
    if name.startswith("EagerLocalExecute: __inference_"):
        return True
    return line.name == "python" and ":" not in name and "::" not in name and name.isidentifier()
