"""The Keras callback: ``model.fit(..., callbacks=[opscope.tensorflow.DumpCallback(path)])``."""

from __future__ import annotations

from typing import Any

import keras


class DumpCallback(keras.callbacks.Callback):
    """Dumps the steps of ``fit`` that the session's config selects.

    At the start of training it installs the capture and has Keras trace its train step
    again (a step traced before the dump started would run without it); at the end it
    writes the dump. Steps are fit batches (with ``steps_per_execution`` > 1 too). An error
    met while writing (a full disk) stops training at the next batch end.
    """

    def __init__(self, session: Any) -> None:
        """``session``: the :class:`~opscope.capture.tensorflow.session.TFDumpSession` to run."""
        super().__init__()
        self.session = session
        self.dump: Any = None

    def on_train_begin(self, logs: Any = None) -> None:
        s = self.session
        if s.model is None:
            s.model = self.model
        # fit runs its step as a tf.function; the eager ops between steps are Keras' own
        # bookkeeping (metric results, iterator), not the model's
        s.eager_ops = bool(getattr(self.model, "run_eagerly", False))
        if not s.started:
            s.start()
        else:
            s.watch_model(self.model)
        if s.active:
            self.model.make_train_function(force=True)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.session.raise_failure()
        last = self.session.cfg.steps.last
        if last is not None and self.session.clock.step > last and not self.session.stopped:
            self._finish()

    def on_train_end(self, logs: Any = None) -> None:
        self._finish()

    def _finish(self) -> None:
        if not self.session.stopped:
            self.dump = self.session.stop()
            if self.session.active:  # back to the plain train step for the rest of training
                self.model.make_train_function(force=True)
