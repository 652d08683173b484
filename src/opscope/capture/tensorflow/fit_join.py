"""A TensorFlow dump started around ``fit`` (``with opscope.tensorflow.dump(...): model.fit(...)``)
rather than as its callback: while the dump runs, each ``fit`` call gets a callback that
records fit as :class:`~opscope.capture.tensorflow.keras.DumpCallback` does: capture paused
during fit's validation, and Keras' eager bookkeeping between steps not recorded (unless the
model runs eagerly). Without it the test function's ops, and the eager ops that set up
validation (``DatasetCardinality``), joined the next training step's records: a dump with
``validation_data`` did not pair with one without.

A TensorFlow profile started as a with-block joins fit the same way (:func:`join_fit`), as
itself: it is a Keras callback. Imported only where Keras is: :func:`join_fit` patches
``keras.Model.fit`` and returns the undo.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras

FIT_CALLBACKS_AT = 5  # fit(x, y, batch_size, epochs, verbose, callbacks, ...): callbacks' position


class FitJoined(keras.callbacks.Callback):
    """Inside ``fit``: eager ops recorded only when the model runs eagerly, and capture paused
    from ``on_test_begin`` to ``on_test_end`` (``evaluate`` called on its own is the user's to
    dump)."""

    def __init__(self, session: Any) -> None:
        super().__init__()
        self.session = session
        self._in_fit = False
        self._paused: Any = None
        self._eager_ops = True

    def on_train_begin(self, logs: Any = None) -> None:
        self._in_fit = True
        self._eager_ops = self.session.eager_ops
        self.session.eager_ops = bool(getattr(self.model, "run_eagerly", False))

    def on_test_begin(self, logs: Any = None) -> None:
        if self._in_fit and self._paused is None and not self.session.stopped:
            self._paused = self.session.tracer.paused()
            self._paused.__enter__()

    def on_test_end(self, logs: Any = None) -> None:
        self._resume()

    def on_train_end(self, logs: Any = None) -> None:
        self._in_fit = False
        self.session.eager_ops = self._eager_ops
        self._resume()

    def _resume(self) -> None:
        if self._paused is not None:
            paused, self._paused = self._paused, None
            paused.__exit__(None, None, None)


def join_fit(session: Any, callback: Callable[[], Any], running: Callable[[], bool]) -> Callable[[], None]:
    """Patch ``keras.Model.fit`` while ``session`` runs (``running()``): a call whose
    callbacks hold neither the session nor one of its own gets ``callback()`` (callbacks given
    as a ``CallbackList`` or by position are left as they are). Returns the undo, which
    restores fit unless another patch replaced this one since. The dump's callback is a
    :class:`FitJoined`; a TensorFlow profile is a Keras callback itself (fit's batches are its
    steps, its validation none: counted as steps otherwise, 18 for 12 batches)."""
    cls = keras.Model
    own = cls.__dict__.get("fit")  # usually inherited from the backend's trainer
    fit = cls.fit

    def joined_fit(model: Any, *args: Any, **kwargs: Any) -> Any:
        given = kwargs.get("callbacks")
        if (running() and len(args) <= FIT_CALLBACKS_AT and isinstance(given, (list, tuple, type(None)))
                and not any(c is session or getattr(c, "session", None) is session for c in given or ())):
            kwargs["callbacks"] = [*(given or ()), callback()]
        return fit(model, *args, **kwargs)

    cls.fit = joined_fit

    def undo() -> None:
        if cls.__dict__.get("fit") is joined_fit:
            if own is None:
                del cls.fit
            else:
                cls.fit = own

    return undo
