"""A TensorFlow dump started around ``fit`` (``with opscope.tensorflow.dump(...): model.fit(...)``)
rather than as its callback: while the dump runs, each ``fit`` call gets a
:class:`~opscope.capture.tensorflow.keras.FitScope`, which records fit as
:class:`~opscope.capture.tensorflow.keras.DumpCallback` does: capture paused during fit's
validation, and Keras' eager bookkeeping between steps not recorded (unless the model runs
eagerly). Without it the test function's ops, and the eager ops that set up
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


def join_fit(session: Any, callback: Callable[[], Any], running: Callable[[], bool]) -> Callable[[], None]:
    """Patch ``keras.Model.fit`` while ``session`` runs (``running()``): a call whose
    callbacks hold neither the session nor one of its own gets ``callback()`` (callbacks given
    as a ``CallbackList`` or by position are left as they are). Returns the undo, which
    restores fit unless another patch replaced this one since. The dump's callback is a
    :class:`~opscope.capture.tensorflow.keras.FitScope`; a TensorFlow profile is a Keras
    callback itself (fit's batches are its steps, its validation none: counted as steps
    otherwise, 18 for 12 batches)."""
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
