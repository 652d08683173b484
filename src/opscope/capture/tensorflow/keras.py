"""The Keras callback: ``model.fit(..., callbacks=[opscope.tensorflow.DumpCallback(path)])``."""

from __future__ import annotations

from typing import Any

import keras


class FitScope(keras.callbacks.Callback):
    """What a dump records of ``fit``, for :class:`DumpCallback` and for the callback that a
    with-block dump gives each ``fit`` (:mod:`~opscope.capture.tensorflow.fit_join`): fit runs its
    step as a tf.function, so the eager ops between steps are Keras' own bookkeeping (metric
    results, the iterator) and are recorded only when the model runs eagerly; fit's validation
    is no training step and runs with capture paused (its test function traced without taps:
    its ops joined the next step's records). ``evaluate`` called on its own is the user's to dump."""

    def __init__(self, session: Any) -> None:
        """``session``: the :class:`~opscope.capture.tensorflow.session.TFDumpSession` recording."""
        super().__init__()
        self.session = session
        self._in_fit = False
        self._validation: Any = None  # capture paused while fit validates
        self._eager_ops = True  # the session's own setting, back at fit's end

    def on_train_begin(self, logs: Any = None) -> None:
        self._in_fit = True
        self._eager_ops = self.session.eager_ops
        self.session.eager_ops = bool(getattr(self.model, "run_eagerly", False))

    def on_test_begin(self, logs: Any = None) -> None:
        if self._in_fit and self._validation is None and not self.session.stopped:
            self._validation = self.session.tracer.paused()
            self._validation.__enter__()

    def on_test_end(self, logs: Any = None) -> None:
        self._resume()

    def on_train_end(self, logs: Any = None) -> None:
        self._in_fit = False
        self.session.eager_ops = self._eager_ops
        self._resume()

    def _resume(self) -> None:
        if self._validation is not None:
            paused, self._validation = self._validation, None
            paused.__exit__(None, None, None)


class DumpCallback(FitScope):
    """Dumps the steps of ``fit`` that the session's config selects.

    At the start of training it installs the capture and has Keras trace its train step
    again (a step traced before the dump started would run without it); the steps not
    selected run fit's own train step, with capture paused, so they cost nothing. At the
    end it writes the dump. Steps are fit batches (with ``steps_per_execution`` > 1 too). An error
    met while writing (a full disk) stops training at the next batch end.
    """

    def __init__(self, session: Any) -> None:
        """``session``: the :class:`~opscope.capture.tensorflow.session.TFDumpSession` to run."""
        super().__init__(session)
        self.dump: Any = None
        # the train step with capture (traced anew) and the one fit made before the dump started,
        # run with capture paused: a step not selected runs plain, and costs nothing
        self._tapped: Any = None
        self._plain: Any = None
        self._plain_call: Any = None
        self._ran_plain = -1  # the first step of the batch the plain step runs (-1: none)

    def on_train_begin(self, logs: Any = None) -> None:
        super().on_train_begin(logs)  # eager ops recorded only when the model runs eagerly
        s = self.session
        if s.model is None:
            s.model = self.model
        if not s.started:
            s.start()
        else:
            s.watch_model(self.model)
        if s.active:
            plain = self.model.train_function
            self.model.make_train_function(force=True)
            self._tapped = self.model.train_function
            if not s.eager_ops and getattr(self.model, "jit_compile", None) is False:
                # no eager op to record and no XLA function to see run: the op callback is
                # needed only while the step is traced
                self._tapped = self.model.train_function = _traces_only(self._tapped, s.tracer)
            if plain is not None and not s.eager_ops:
                self._plain = plain
                self._plain_call = _paused(plain, s.tracer)
            if not s.eager_ops and getattr(self.model, "jit_compile", None) is False:
                s.tracer.defer(True)  # back at the end of the dump (_finish)
        self._ran_plain = -1

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if self._plain is None or self.session.stopped:
            return
        current = self.model.train_function
        if current is not self._tapped and current is not self._plain_call:
            self._plain = None  # another callback made its own train step: it runs every step
            return
        clock, steps = self.session.clock, self.session.cfg.steps
        first = clock.step + int(clock.pending)
        ahead = int(getattr(self.model, "steps_per_execution", 1) or 1)
        wanted = self.session.failure is None and any(k in steps for k in range(first, first + ahead))
        self.model.train_function = self._tapped if wanted else self._plain_call
        self._ran_plain = -1 if wanted else batch

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self._ran_plain >= 0:
            self.session.steps_ran(batch - self._ran_plain + 1)  # the tapped step counts its own
            self._ran_plain = -1
        self.session.raise_failure()
        last = self.session.cfg.steps.last
        if last is not None and self.session.clock.step > last and not self.session.stopped:
            self._finish()

    def on_train_end(self, logs: Any = None) -> None:
        super().on_train_end(logs)
        self._finish()

    def _finish(self) -> None:
        self._resume()
        self.session.tracer.defer(False)
        if not self.session.stopped:
            self.dump = self.session.stop()
            if self._plain is not None and self.model.train_function in (self._tapped, self._plain_call):
                self.model.train_function = self._plain  # the rest of training runs the plain step
            elif self.session.active:  # back to a plain train step for the rest of training
                self.model.make_train_function(force=True)


def _paused(train_function: Any, tracer: Any) -> Any:
    """``train_function`` called with capture paused (a retrace inside gets no host callback)."""
    def plain_train_function(*args: Any, **kwargs: Any) -> Any:
        with tracer.paused():
            return train_function(*args, **kwargs)
    return plain_train_function


def _traces_only(train_function: Any, tracer: Any) -> Any:
    """``train_function`` called with the op callback on only while it is traced."""
    def dumped_train_function(*args: Any, **kwargs: Any) -> Any:
        with tracer.traces_only():
            return train_function(*args, **kwargs)
    return dumped_train_function
