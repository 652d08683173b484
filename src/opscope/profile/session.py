"""``opscope.profile``: training trace on every step, task trace on the chosen steps.

>>> with opscope.profile("prof/run1", steps="5-10", task_trace=True) as p:  # doctest: +SKIP
...     for x, y in loader:
...         loss = loss_fn(model(x), y); loss.backward(); opt.step(); opt.zero_grad()
...         p.step()
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opscope.capture.steps import StepClock
from opscope.config import ProfileConfig
from opscope.errors import ConfigError, ProfileError
from opscope.profile import output
from opscope.profile.breakdown import breakdown
from opscope.profile.calibration import Calibration, SchedWait, WaitTimeline, read_gap_ns
from opscope.profile.chrome_trace import TID_COMM, TID_PHASES, TID_STEPS, TraceWriter, span
from opscope.profile.model import PHASES, PRIORITY, ProfileResult, RawStep, StepRow

_active: ProfileSession | None = None
MAX_SPAN_STEPS = 10_000  # steps drawn as spans in trace.json.gz; the rest are in steps.parquet
NARROW_AT = 2  # from this step on only the outermost modules seen are hooked (PhaseTimers.narrow)


class ProfileWarning(UserWarning):
    """Something about the profile the user should know (window never reached, ...)."""


class ProfileSession:
    """One profile of one process (see :func:`opscope.profile`). ``stop()`` returns a
    :class:`ProfileResult`.

    Args:
        config: the resolved ``profile`` config.
        html: renders the merged profile as ``report.html`` (None: no page).
    """

    def __init__(self, config: ProfileConfig, html: Callable[[Any], str] | None = None) -> None:
        if not (config.training_trace or config.task_trace):
            raise ConfigError("profile: training_trace and task_trace are both off: nothing to record")
        self.config = config
        self.html = html
        self.rank = 0
        self.state = "new"
        self.result: ProfileResult | None = None
        self._rows: list[StepRow] = []
        self._pending: list[RawStep] = []
        self._raw: RawStep | None = None
        self._spans: list[tuple[int, bool, int, int, dict[str, list[tuple[int, int]]]]] = []
        self.task: Any = None
        self.sched: SchedWait | None = None
        self.timeline: WaitTimeline | None = None
        self.calibration: Calibration | None = None

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> ProfileSession:
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            self.stop()
            return
        try:
            self.stop(error=exc)
        except ProfileError as write_error:  # never hide the user's own exception behind ours
            warnings.warn(str(write_error), ProfileWarning, stacklevel=2)

    def start(self) -> ProfileSession:
        """Install the timers and begin step 0."""
        global _active
        if self.state != "new":
            raise ProfileError("this profile session was already started; make a new one with opscope.profile(...)")
        from opscope.capture.torch.dist import current_rank, world_size

        self.rank, self.world = current_rank(), world_size()
        if not self.config.enable or (self.config.ranks is not None and self.rank not in self.config.ranks):
            self.state = "skipped"
            return self
        if _active is not None:
            raise ProfileError(f"another profile ({_active.config.output}) is running in this process; stop it first")
        self.folder = output.prepare(Path(self.config.output), self.rank, self.config)
        self.sched = SchedWait.open()  # this thread's run-queue wait, per step (Linux)
        self.calibration = Calibration(self.sched)
        self.calibration.run("start")  # outside every step: before the hooks and step 0
        from opscope.profile.clock import HostClock, pick_clock

        self.clock = pick_clock(self.config.clock)
        if self.sched is not None and isinstance(self.clock, HostClock):
            self.timeline = WaitTimeline(self.sched, self.clock.mark, read_gap_ns(self.sched))
            self.clock.mark = self.timeline.mark  # before the timers take it: wait per phase
        self.origin = time.perf_counter_ns()
        self.trace = TraceWriter(self.folder / "trace.json.gz", self.rank)
        if self.config.task_trace:
            from opscope.profile.task_trace import TaskTrace

            self.task = TaskTrace(self.trace, self.rank, self.origin, self.config.record_shapes, self.config.with_stack)
        from opscope.capture.torch.optimizers import has_optimizer

        self.steps = StepClock(on_boundary=self._boundary, has_optimizer=has_optimizer)
        self._install()
        _active = self
        self.state = "running"
        self._begin(0)
        return self

    def _install(self) -> None:
        from opscope.profile.phases import PhaseTimers

        cfg = self.config
        self.timers = PhaseTimers(
            self.clock,
            on_outer_call=self.steps.outer_module_call,
            on_optimizer_step=self.steps.optimizer_step,
            poll=self.steps.poll,
            fp_point=cfg.fp_point,
            bp_point=cfg.bp_point,
            detailed=cfg.training_trace,
            on_zero_grad=self.steps.zero_grad,
        )
        try:
            self.timers.install()
        except BaseException:
            self.timers.remove()
            self.trace.abort("hooks could not be installed")
            raise

    def step(self) -> None:
        """Mark the end of a training step (optional: without it, optimizer steps count)."""
        if self.state == "running":
            self.steps.user_step()

    def stop(self, error: BaseException | None = None) -> ProfileResult:
        """Remove every hook, write the files and return the result (idempotent)."""
        global _active
        if self.result is not None:
            return self.result
        if self.state in ("new", "skipped"):
            self.result = ProfileResult(self.config.output, self.rank, "skipped", [], {}, [])
            return self.result
        try:
            self.timers.remove()
            if error is None:
                self.steps.poll()
            self._finish_last(error)
        finally:
            self.timers.remove()
            if self.task is not None:
                self.task.abort()
            _active = None
            self.state = "stopped"
        if error is None and self.calibration is not None:
            self.calibration.run("end")  # after the last step and with the hooks removed
        if self.sched is not None:
            self.sched.close()
        self.result = output.finish(self, error)
        for message in self.result.warnings:
            warnings.warn(message, ProfileWarning, stacklevel=2)
        return self.result

    # ------------------------------------------------------------------ steps
    def _begin(self, step: int, wait: int | None = None) -> None:
        """Open ``step``; ``wait``: the run-queue wait just read at the boundary, if any."""
        traced = self.task is not None and step in self.config.steps
        if traced:
            self.task.begin()
        if wait is None or traced:  # the task trace's start took time since
            start, read = self._stamp()
            wait = read or 0
        elif self.timeline is not None:  # read again when the step's close took longer than the gap
            start = self.timeline.mark()
            wait = self.timeline.at(start)
        else:
            start = self.clock.mark()
        self._raw = RawStep(step=step, start=start, task_trace=traced, wait_start=wait)

    def _stamp(self) -> tuple[Any, int | None]:
        """A clock mark and the run-queue wait at it (``None`` where the kernel does not say):
        on the host clock read between two marks (:meth:`WaitTimeline.stamp`); on a device
        clock, whose phases are not split, read just before the mark."""
        if self.timeline is not None:
            return self.timeline.stamp()
        wait = self.sched.read() if self.sched is not None else None
        return self.clock.mark(), wait

    def _boundary(self, finished: int, following: int) -> None:
        end, read = self._stamp()
        wait = self._close(end, True, read)
        self._begin(following, wait)  # one read ends a step and begins the next
        if following == NARROW_AT:
            self.timers.narrow()
        missing = self.timers.unresolved_points() if finished == 0 else []
        if missing:
            raise ConfigError(
                f"profile: fp_point/bp_point {missing} matched no module of the model; "
                "give a module path as printed by model.named_modules(), or null for the automatic point"
            )

    def _current(self) -> RawStep:
        """The step being timed: one exists from :meth:`start` (step 0 begins there) on."""
        if self._raw is None:
            raise ProfileError("opscope internal error: the profile has no step being timed")
        return self._raw

    def _close(self, end: Any, complete: bool, wait: int | None) -> int | None:
        """Close the current step at ``end``, the run-queue wait there being ``wait`` (:meth:`_stamp`);
        returns that wait for the next step to begin with (None after a task-traced step:
        its export ran since)."""
        raw = self._current()
        exported = raw.task_trace
        raw.end, raw.complete = end, complete
        if wait is not None:
            raw.wait_ns = wait - raw.wait_start
        raw.intervals = self.timers.take(end)
        if raw.task_trace or raw.step in self.config.steps:
            host = self._host_intervals(raw)
            if raw.task_trace:
                if complete:
                    self.task.end(raw.step, host)
                else:
                    self.task.abort()
                    raw.task_trace = False
            if len(self._spans) < MAX_SPAN_STEPS:
                # Written at stop: JSON work per step would cost more than the timers.
                self._spans.append((raw.step, raw.complete, self.clock.host(raw.start), self.clock.host(raw.end), host))
        self._pending.append(raw)
        self._resolve(keep_last=self.clock.is_device)
        return None if exported else wait

    def _finish_last(self, error: BaseException | None) -> None:
        end, wait = self._stamp()
        raw = self._current()
        intervals = self.timers.intervals
        busy = any(intervals[p] for p in ("forward", "backward", "optimizer")) or self.timers._fwd_open is not None
        idle_tail = error is None and raw.step > 0 and (not busy if self.config.training_trace else self.steps.manual)
        if idle_tail:
            self.timers.take(end)
            if self.task is not None:
                self.task.abort()
        else:
            self._close(end, error is None, wait)
        self._resolve(keep_last=False)

    def _resolve(self, keep_last: bool) -> None:
        """Turn closed raw steps into rows; on a device clock the newest waits a step."""
        while len(self._pending) > (1 if keep_last else 0):
            raw = self._pending.pop(0)
            self.clock.ready(raw.end)
            self._rows.append(self._row(raw))

    def _row(self, raw: RawStep) -> StepRow:
        if self.clock.is_device:
            resolve = self.clock.resolve
            start, end = resolve(raw.start), resolve(raw.end)
            intervals = {p: [(resolve(a), resolve(b)) for a, b in ivs] for p, ivs in raw.intervals.items()}
        else:
            start, end, intervals = raw.start, raw.end, raw.intervals
        phases, comm_total, overlap = breakdown(start, end, intervals)
        row = StepRow(self.rank, raw.step, start - self.origin, end - start, phases, comm_total, overlap,
                      raw.task_trace, raw.complete, raw.wait_ns)
        if self.timeline is not None and not self.clock.is_device:
            # A step that never waited for a CPU (the usual one on a quiet machine) needs no split.
            row.phase_waits = self.timeline.phases(start, end, intervals) if raw.wait_ns else dict.fromkeys(PHASES, 0)
            self.timeline.trim(end)
        return row

    def _host_intervals(self, raw: RawStep) -> dict[str, list[tuple[int, int]]]:
        if not self.clock.is_device:  # host marks already: nothing to convert, nothing changes them later
            return raw.intervals
        host = self.clock.host
        return {p: [(host(a), host(b)) for a, b in ivs] for p, ivs in raw.intervals.items()}

    def write_spans(self) -> None:
        """The buffered steps and their phase intervals as trace spans (host timeline)."""
        origin, rank = self.origin, self.rank
        for step, complete, start, end, host in self._spans:
            label = f"step {step}" + ("" if complete else " (raised)")
            self.trace.event(span(label, rank, TID_STEPS, (start - origin) / 1000, (end - start) / 1000,
                                  {"step": step}))
            for phase in PRIORITY:
                tid = TID_COMM if phase == "communication" else TID_PHASES
                for lo, hi in host.get(phase, ()):
                    self.trace.event(span(phase, rank, tid, (lo - origin) / 1000, (hi - lo) / 1000, {"step": step}))
        self._spans.clear()

    @property
    def rows(self) -> list[StepRow]:
        """Steps resolved so far."""
        return list(self._rows)
