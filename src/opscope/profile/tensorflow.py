"""``opscope.tensorflow.profile``: the training trace and task trace for TensorFlow / Keras.

The same files as the PyTorch profile (``steps.parquet``, ``ops.parquet``, ``trace.json.gz``,
``summary.json``, ``report.html``), so ``opscope profile show`` and ``diff`` read both.

>>> with opscope.tensorflow.profile("prof/run1", task_trace=True, steps="5-6") as p:  # doctest: +SKIP
...     for x, y in dataset:
...         train_step(x, y)             # a tf.function, or eager code
...         p.step()
>>> model.fit(ds, callbacks=[opscope.tensorflow.profile("prof/run2")])  # doctest: +SKIP

The session is a Keras callback: in ``fit`` a step is one batch, from one batch's start to
the next (a call that runs ``steps_per_execution`` batches is split at each batch's
optimizer end: :func:`~opscope.profile.tensorflow_phases.split_batches`). Without ``p.step()``
or the callback, a step ends after each call of a ``tf.function`` that applies an optimizer
(in eager code, after each ``optimizer.apply``). How the phases are timed:
:mod:`opscope.profile.tensorflow_marks`; how calls become rows:
:mod:`opscope.profile.tensorflow_steps`.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import keras

from opscope.capture.steps import StepClock
from opscope.capture.tensorflow.fit_join import join_fit
from opscope.config import ProfileConfig, profile_config
from opscope.errors import ConfigError, ProfileError
from opscope.profile import output
from opscope.profile.calibration import GAP_NS, Calibration, SchedWait, stamped_read
from opscope.profile.chrome_trace import TraceWriter
from opscope.profile.model import ProfileResult, StepRow
from opscope.profile.session import ProfileWarning
from opscope.profile.tensorflow_marks import NO_MARKS, READ_EVERY, SPE_NO_TRACE, SPE_NOTE, PhaseMarks
from opscope.profile.tensorflow_phases import StepWindow, phases_in
from opscope.profile.tensorflow_steps import Pending, StepTable

_active: TFProfileSession | None = None


class TFProfileSession(keras.callbacks.Callback):
    """One TensorFlow profile of one process; a context manager and a Keras callback.

    Args:
        config: the resolved ``profile`` config (``clock`` must be ``auto`` or ``host``).
        html: renders the merged profile as ``report.html`` (None: no page).
    """

    def __init__(self, config: ProfileConfig, html: Callable[[Any], str] | None = None) -> None:
        super().__init__()
        if not (config.training_trace or config.task_trace):
            raise ConfigError("profile: training_trace and task_trace are both off: nothing to record")
        if config.clock not in ("auto", "host"):
            raise ConfigError(
                f"profile: clock {config.clock!r} is for PyTorch; "
                'TensorFlow profiles use the host clock ("auto" or "host")'
            )
        self.config = config
        self.html = html
        self.rank, self.world = 0, 1
        self.state = "new"
        self._unjoin: Callable[[], None] = lambda: None  # fit patched while a with-block runs
        self.result: ProfileResult | None = None
        self.task: Any = None
        self.calibration: Calibration | None = None
        self.sched: SchedWait | None = None
        self.table = StepTable(0, config.steps, config.training_trace, self._note)
        self._by_callback = False
        self._batch_seen = False
        self._models: list[Any] = []
        self._spe = 1  # batches per call of the train function (Keras steps_per_execution)
        self._step_spe = 1  # batches the open step's call may run
        self._step, self._traced = 0, False
        self._in_fit = False
        self._manual_before_fit = False  # the step clock's mode when fit began (restored at its end)
        self._gap = self._gap_next = False  # the open piece is fit's validation, not a step

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> TFProfileSession:
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        if exc is None:
            self.stop()
            return False
        try:
            self.stop(error=exc)
        except ProfileError as write_error:  # never hide the user's own exception behind ours
            warnings.warn(str(write_error), ProfileWarning, stacklevel=2)
        return False

    def start(self) -> TFProfileSession:
        """Install the hooks and begin step 0."""
        global _active
        if self.state != "new":
            raise ProfileError(
                "this profile session was already started; make a new one with opscope.tensorflow.profile(...)"
            )
        from opscope.capture.torch.dist import current_rank, world_size

        self.rank, self.world = current_rank(), world_size()
        cfg = self.config
        if not cfg.enable or (cfg.ranks is not None and self.rank not in cfg.ranks):
            self.state = "skipped"
            return self
        if _active is not None:
            raise ProfileError(
                f"another TensorFlow profile ({_active.config.output}) is running in this process; stop it first"
            )
        self.folder = output.prepare(Path(cfg.output), self.rank, cfg)
        self.sched = SchedWait.open()
        self.calibration = Calibration(self.sched)
        self.calibration.run("start")
        self.origin = self.table.origin = time.perf_counter_ns()
        self.table.rank = self.rank
        self.trace = TraceWriter(self.folder / "trace.json.gz", self.rank)
        if cfg.task_trace:
            from opscope.profile.tensorflow_trace import TFTaskTrace

            self.task = TFTaskTrace(self.trace, self.rank, self.origin, self.folder)
        self._install()
        _active = self
        self.state = "running"
        # a with-block around fit: fit gets this session as its callback (fit_join)
        self._unjoin = join_fit(self, lambda: self, lambda: self.state == "running")
        self._begin(0)
        return self

    def _install(self) -> None:
        cfg = self.config
        self.steps = StepClock(on_boundary=self._boundary)
        self.timers = PhaseMarks(
            self.steps.poll, self.steps.optimizer_step, cfg.fp_point, cfg.bp_point, cfg.training_trace
        )
        try:
            self.timers.install()
        except BaseException:
            self.timers.remove()
            self.trace.abort("hooks could not be installed")
            raise

    def step(self) -> None:
        """Mark the end of a training step (optional, see the module's docstring)."""
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
            if error is None:
                self.steps.poll()
            self._finish_last(error)
        finally:
            self._unjoin()
            self.timers.remove()
            if self.task is not None:
                self.task.abort()
            for model in self._models:  # its train function holds opscope's marks: trace anew
                model.train_function = None
            _active = None
            self.state = "stopped"
        if error is None and self.calibration is not None:
            self.calibration.run("end")
        if self.sched is not None:
            self.sched.close()
        if self.config.training_trace and self.table.rows and not self.table.marked and not self.timers.notes:
            self.timers.notes.append(NO_MARKS)
        self.result = output.finish(self, error)
        for message in self.result.warnings:
            warnings.warn(message, ProfileWarning, stacklevel=2)
        return self.result

    # ------------------------------------------------------------------ Keras callback
    def on_train_begin(self, logs: Any = None) -> None:
        """Start the session when ``fit`` starts (unless it runs already); trace the train
        function anew so that it holds the phase marks."""
        model = self.model
        self._spe = max(1, int(getattr(model, "steps_per_execution", 1) or 1)) if model is not None else 1
        if self.state == "new":
            self._by_callback = True
            self.start()
        elif self.state == "stopped":
            warnings.warn(
                f"the profile {self.config.output} already finished (with an earlier fit): this fit is not "
                "profiled; hand fit a new opscope.tensorflow.profile(...), or run both fits inside one `with`",
                ProfileWarning,
                stacklevel=2,
            )
        self._in_fit = self.state == "running"
        if self.state == "running" and model is not None and all(m is not model for m in self._models):
            self._models.append(model)
            model.make_train_function(force=True)
            if self._spe > 1 and not self.config.training_trace:
                self._note(SPE_NOTE.format(spe=self._spe, why=SPE_NO_TRACE))
        self._manual_before_fit = self.steps.manual if self.state == "running" else False
        if self.state == "running" and not self._batch_seen:  # the step open now is fit's first call
            self._step_spe = self._spe
            if self._spe > 1 and not self._traced and self._wanted(self._step):  # begun before spe was known
                self.task.begin()
                self._traced = True

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        """A new call of the train function: the previous one's step ends here."""
        if self.state != "running":
            return
        if self._batch_seen:
            self.steps.user_step()
        else:
            self.steps.manual = True  # from now on only batches end steps
            self._batch_seen = True

    def on_test_begin(self, logs: Any = None) -> None:
        """fit's validation: the train step before it ends here, and the validation, up to the
        next batch, is no step (it used to swell each epoch's last step: tracing and running
        the test function, 160 ms against ~1 ms)."""
        if self.state == "running" and self._in_fit and self._batch_seen:
            self._gap_next = True
            self.steps.user_step()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        """With ``steps_per_execution`` > 1 an epoch's last call may run fewer batches: read
        the marks now, so that the next calls' batch numbers (for ``steps``) are exact."""
        if self.state == "running" and self._spe > 1 and self.table.pending:
            self._resolve()

    def on_train_end(self, logs: Any = None) -> None:
        """Stop the session if ``fit`` started it; else its steps are found as before fit
        again (a custom loop after fit, in a with-block that joined fit)."""
        self._in_fit = False
        if self._by_callback:
            self.stop()
        elif self._batch_seen and self.state == "running":  # fit's last batch ends here
            self.steps.user_step()
            self.steps.manual, self._batch_seen = self._manual_before_fit, False
        self._spe = 1

    # ------------------------------------------------------------------ steps
    def _wanted(self, step: int) -> bool:
        """Whether the call ``step`` (of the step clock) runs a batch of ``steps``."""
        first = self.table.first_batch(step)
        return self.task is not None and any(k in self.config.steps for k in range(first, first + self._spe))

    def _begin(self, step: int) -> None:
        self._gap, self._gap_next = self._gap_next, False
        traced = not self._gap and self._wanted(step)
        if traced:
            self.task.begin()
        self._step, self._traced, self._step_spe = step, traced, self._spe
        self._start, self._wait0 = self._stamp()

    def _boundary(self, finished: int, following: int) -> None:
        self._close(*self._stamp(), complete=True)
        self._begin(following)
        missing = self.timers.unresolved_points() if finished == 0 else []
        if missing:
            raise ConfigError(
                f"profile: fp_point/bp_point {missing} matched no Keras layer of the model; "
                "give a layer name (layer.name) or null for the automatic point"
            )

    def _stamp(self) -> tuple[int, int]:
        """The clock's ns now and the run-queue wait at it (:func:`~opscope.profile.calibration.stamped_read`)."""
        if self.sched is None:
            return time.perf_counter_ns(), 0
        return stamped_read(self.sched.read, time.perf_counter_ns, GAP_NS)

    def _close(self, end: int, wait_now: int, complete: bool) -> None:
        """End the current step at ``end``, the run-queue wait there being ``wait_now``; its row is
        made when the graph marks are next read."""
        if self._gap:  # fit's validation: no row, and its number goes to the next batch
            if self.table.pending:  # numbered before the count moves
                self._resolve()
            self.timers.take_host(self._start, end)
            self._gap = False
            self.table.skip()
            return
        traced = self._traced and complete
        if self._traced and not complete:
            self.task.abort()
        self._traced = False  # ended once, whatever happens below
        wait = wait_now - self._wait0
        host = self.timers.take_host(self._start, end)
        self.table.pending.append(Pending(self._step, self._start, end, host, traced, complete, wait, self._step_spe))
        if traced:
            self.task.stop()  # before the marks are read: that read is opscope's, not the step's
        if traced or len(self.table.pending) >= READ_EVERY:
            windows = self._resolve()
            if traced:
                self.task.end(windows)

    def _resolve(self) -> list[StepWindow]:
        """Read the graph marks once and turn every pending step into its rows (one per batch
        of a call that ran several); returns the last call's ``(step, start, end, intervals)``."""
        return self.table.resolve(self.timers.graph_marks(time.time_ns() - time.perf_counter_ns()))

    def _note(self, message: str) -> None:
        if message not in self.timers.notes:
            self.timers.notes.append(message)

    def _finish_last(self, error: BaseException | None) -> None:
        end, wait = self._stamp()
        if error is None and self._step > 0 and (self._gap or self._idle(end)):
            self.timers.take_host(self._start, end)
            if self.task is not None:
                self.task.abort()
        else:
            self._close(end, wait, complete=error is None)
        self._resolve()

    def _idle(self, end: int) -> bool:
        """A trailing piece after the last boundary with no step work in it is not a step."""
        if not self.config.training_trace:
            return self.steps.manual
        marks = self.timers.graph_marks(time.time_ns() - time.perf_counter_ns())
        marks += [(t, s) for s, t in self.timers.host]
        intervals = phases_in(self._start, end, marks)
        return not any(intervals[p] for p in ("forward", "backward", "optimizer"))

    # ------------------------------------------------------------------ output
    @property
    def rows(self) -> list[StepRow]:
        """Steps recorded so far."""
        return list(self.table.rows)

    def write_spans(self) -> None:
        """The buffered steps and their phase intervals as trace spans."""
        self.table.write_spans(self.trace)


def make_session(
    output: str | os.PathLike | None = None, config: Any = None, html: Callable[[Any], str] | None = None, **keys: Any
) -> TFProfileSession:
    """A :class:`TFProfileSession` from a folder, a config (file or mapping; its ``profile``
    section, ``profiling_options`` spellings included) and keyword overrides. The public
    :func:`opscope.tensorflow.profile` calls it with the HTML renderer."""
    return TFProfileSession(
        profile_config(config, output=None if output is None else os.fspath(output), **keys), html=html
    )


def start_profile(config: ProfileConfig, html: Callable[[Any], str] | None = None) -> TFProfileSession | None:
    """Start a TensorFlow profile from a resolved config (zero-code: ``opscope run``,
    ``$OPSCOPE_CONFIG``); None when one runs already. The caller stops it at exit."""
    if _active is not None:
        return None
    session = TFProfileSession(config, html=html)
    session.start()
    return session
