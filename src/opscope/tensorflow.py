"""opscope for TensorFlow / Keras: ``opscope.tensorflow.dump`` (and ``profile``).

Importing this module imports nothing heavy; TensorFlow is imported when a dump starts.
See docs/tensorflow.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opscope.capture.tensorflow import real_tf
from opscope.capture.tensorflow.options import LEVELS, resolve

real_tf.ensure()  # (nothing to do, and nothing imported, unless msprobe left its stub)

if TYPE_CHECKING:
    from opscope.capture.tensorflow.keras import DumpCallback as _DumpCallback
    from opscope.capture.tensorflow.session import TFDumpSession
    from opscope.profile.tensorflow import TFProfileSession
    from opscope.watch.tensorflow import TFWatch

def dump(path: str | os.PathLike | None = None, *, config: str | os.PathLike | Mapping | None = None,
         model: Any = None, **keys: Any) -> TFDumpSession:
    """Record what every TensorFlow op (or Keras layer) receives and produces.

    Use it as a context manager around a custom training loop (call ``d.step()`` after each
    iteration, or let opscope end a step when the optimizer applies gradients), with
    ``start()``/``stop()``, or hand ``d.callback()`` to ``model.fit(callbacks=[...])``.

    Args:
        path: the dump directory (or ``path`` / ``dump_path`` in the config).
        config: a config file path or mapping (its ``dump`` section); ``$OPSCOPE_CONFIG`` if None.
        model: the Keras model, to name its variables in the ``param`` column (fit's
            callback finds it itself).
        **keys: ``steps``, ``ranks``, ``mode``, ``level`` (``"op"``: every op; ``"layer"``: Keras
            layer inputs/outputs and parameter gradients), ``data`` (``"statistics"`` or
            ``"tensor"``), ``scope``, ``ops``, ``phases``, ``overwrite``, ``enable``,
            ``queue_limit_mb``, ``shard_mb``; the seeds' ``enable_dump``, ``dump_path``,
            ``dump_step``, ``dump_mode`` too.

    Returns:
        A :class:`TFDumpSession`; ``stop()`` returns the written :class:`opscope.Dump`.

    Raises:
        ConfigError: a bad key or value, before anything is captured.
    """
    from opscope.capture.tensorflow.session import TFDumpSession

    real_tf.ensure()
    cfg, level = resolve(config, path, keys)
    return TFDumpSession(cfg, level, model)


def watch(*, action: str = "raise", steps: Any = "all", model: Any = None) -> TFWatch:
    """Find the first TensorFlow op whose output holds a NaN or Inf, with its layer, its
    inputs' statistics and its chain (the seeds' overflow detection, for TensorFlow).

    Use it like :func:`dump`: a context manager around a custom loop (``w.step()``), or
    ``model.fit(callbacks=[w.callback()])``. ``stop()`` returns a :class:`~opscope.watch.events.WatchResult`.

    Args:
        action: ``raise`` (:class:`~opscope.errors.OverflowDetected` at the end of the step
            that produced it), ``warn`` (print the report once per op) or ``record``.
        steps: the steps watched (``"all"``, ``"0-3"``...).
        model: the Keras model, to name parameters.
    """
    from opscope.report import renderer
    from opscope.watch.tensorflow import TFWatch

    real_tf.ensure()

    return TFWatch(action, steps, model, report=renderer("OverflowEvent", "text"))


def DumpCallback(path: str | os.PathLike | None = None, **keys: Any) -> _DumpCallback:  # noqa: N802 - a class to the user
    """A Keras callback that dumps ``fit``: ``model.fit(..., callbacks=[DumpCallback("dumps/run")])``.

    Takes the arguments of :func:`dump`; its ``dump`` attribute holds the written dump after fit.
    """
    return dump(path, **keys).callback()


def profile(output: str | os.PathLike | None = None, *, config: Any = None, **keys: Any) -> TFProfileSession:
    """Profile TensorFlow / Keras training: training trace on every step, task trace
    (TensorFlow's profiler) on the chosen ``steps``. A context manager around a custom loop
    (``p.step()`` after each iteration) and a Keras callback (``fit(callbacks=[p])``).

    Args: ``output`` folder; ``config`` file or mapping (its ``profile`` section, Ascend's
    ``profiling_options`` too); ``steps``, ``ranks``, ``training_trace``, ``task_trace``,
    ``fp_point``/``bp_point`` (Keras layer names), ``warmup``, ``overwrite``, ``enable``.
    See docs/tensorflow.md, "Profile".
    """
    from opscope.profile.tensorflow import make_session
    from opscope.report import renderer

    real_tf.ensure()

    return make_session(output, config, html=renderer("ProfileData", "html"), **keys)


__all__ = ["LEVELS", "DumpCallback", "dump", "profile", "resolve", "watch"]
