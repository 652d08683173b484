"""Zero-code TensorFlow: what ``opscope run`` / ``$OPSCOPE_CONFIG`` do in a TensorFlow program.

:mod:`opscope.autostart` waits for ``import tensorflow`` as it waits for ``import torch``;
then :func:`arm_tensorflow` and :func:`arm_keras` patch, once, the two places where TensorFlow training begins: Keras'
``Model.fit`` (the dump joins its callbacks, so the train step is traced with capture on)
and the first call of any ``tf.function`` (a custom loop's step, traced after capture
starts). The first of them starts the configured sessions; both patches are undone then.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def arm_tensorflow(first_use: Callable[[], list[tuple[str, Any]]]) -> None:
    """After ``import tensorflow``: the first ``tf.function`` call starts the sessions
    (``first_use()`` starts them once and returns them)."""
    from tensorflow.python.eager.polymorphic_function import polymorphic_function as pf

    call = pf.Function.__dict__["__call__"]

    def patched_call(function: Any, *args: Any, **kwargs: Any) -> Any:
        pf.Function.__call__ = call
        first_use()
        # through the class again: a session started just now may have wrapped __call__ (the
        # TensorFlow profile counts a custom loop's steps there), and this call is its first
        return pf.Function.__call__(function, *args, **kwargs)

    pf.Function.__call__ = patched_call


def arm_keras(first_use: Callable[[], list[tuple[str, Any]]]) -> None:
    """After ``import keras``: ``Model.fit`` starts the sessions and adds the callbacks of the
    dump and of the overflow watch."""
    import keras

    own = keras.Model.__dict__.get("fit")  # fit is usually inherited (the backend's trainer)
    fit = keras.Model.fit

    def patched_fit(model: Any, *args: Any, **kwargs: Any) -> Any:
        if own is None:
            del keras.Model.fit
        else:
            keras.Model.fit = own
        sessions = first_use()
        dumps = [s for name, s in sessions if name in ("dump", "overflow") and hasattr(s, "callback")
                 and not s.stopped]
        added = [s.callback() for s in dumps]
        # the profile is a callback itself: fit's batches are its steps (steps_per_execution too)
        added += [s for name, s in sessions if name == "profile" and getattr(s, "state", None) == "running"]
        if added:
            kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), *added]
        return fit(model, *args, **kwargs)

    keras.Model.fit = patched_fit


def make_session(name: str, cfg: Any, path: str) -> Any:
    """The session a config section starts in a TensorFlow program (None: not for TensorFlow)."""
    if name == "dump":
        if "opscope.capture.tensorflow.session" in sys.modules and _script_has_session():
            return None
        from opscope.capture.tensorflow.options import resolve
        from opscope.capture.tensorflow.session import TFDumpSession

        cfg, level = resolve(path, None, {})
        return TFDumpSession(cfg, level)
    # profile: part B (TensorFlow profile) starts its session here
    sys.stderr.write(f"opscope: the {name} section is not available for TensorFlow programs yet; skipped\n")
    return None


def _script_has_session() -> bool:
    main = sys.modules.get("__main__")
    return any(type(v).__name__ == "TFDumpSession" for v in vars(main).values()) if main else False
