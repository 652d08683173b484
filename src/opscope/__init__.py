"""opscope: find where a deep-learning model's numbers go wrong and where its time goes.

Public API (each imported lazily, so ``import opscope`` is cheap and torch-free):

- :func:`dump` — record what every operator receives and produces (``opscope.capture``).
- :func:`load` — open a dump written earlier.
- :func:`compare` — line two dumps up and name the operator where they start to differ.
- :func:`profile` — training trace and task trace of a training loop.
- :func:`watch` — catch the first operator that makes NaN or Inf.
- :func:`monitor` — training-state statistics every step, and which tensor moved first.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opscope._version import __version__
from opscope.errors import (
    ConfigError,
    DumpExistsError,
    DumpFormatError,
    DumpWriteError,
    OpscopeError,
    OverflowDetected,
)

if TYPE_CHECKING:
    from opscope.monitor.session import MonitorSession
    from opscope.profile.session import ProfileSession
    from opscope.watch.session import WatchSession


_LAZY = {
    "dump": ("opscope.capture.torch.session", "dump"),
    "load": ("opscope.storage.reader", "load"),
    "Dump": ("opscope.storage.reader", "Dump"),
    "compare": ("opscope.compare.api", "compare"),
}

__all__ = [
    "ConfigError",
    "Dump",
    "DumpExistsError",
    "DumpFormatError",
    "DumpWriteError",
    "OpscopeError",
    "OverflowDetected",
    "__version__",
    "compare",
    "dump",
    "load",
    "monitor",
    "profile",
    "watch",
]


def profile(output: str | os.PathLike | None = None, *, config: Any = None, **keys: Any) -> ProfileSession:
    """Profile a training loop: training trace on every step, task trace on the chosen steps.

    Args:
        output: folder for the profile (Ascend ``output``); or ``"output"`` in the config.
        config: a config file or mapping whose ``"profile"`` section holds the same keys.
        **keys: ``steps``, ``ranks``, ``training_trace``, ``task_trace``, ``fp_point``,
            ``bp_point``, ``record_shapes``, ``with_stack``, ``warmup``, ``clock``,
            ``overwrite``, ``enable``, ``merge_timeout`` (see docs/profile.md).

    Returns:
        A :class:`~opscope.profile.session.ProfileSession`; use it as a context manager or
        call ``start()``/``stop()``.
    """
    from opscope.config import profile_config
    from opscope.profile.session import ProfileSession
    from opscope.report import renderer

    return ProfileSession(profile_config(config, output=output, **keys), html=renderer("ProfileData", "html"))


def watch(action: str | None = None, *, config: Any = None, **keys: Any) -> WatchSession:
    """Check every op output for NaN/Inf (and values beyond ``limit``) while training runs.

    Use as a context manager around the loop, with ``w.step(loss=loss)`` at each step's
    end (or let opscope find steps from ``optimizer.step()``), or ``start()``/``stop()``.

    Args:
        action: ``raise`` (default), ``warn`` or ``record`` (flight recorder).
        config: a config file (JSON, YAML, TOML) or mapping with an ``overflow`` section;
            ``$OPSCOPE_CONFIG`` if None.
        **keys: level (``aten``/``module``), limit, path, history, loss_spike, time_spike,
            steps, ranks, enable (see docs/overflow.md).

    Returns:
        A :class:`~opscope.watch.session.WatchSession`; its ``stop()`` returns a
        :class:`~opscope.watch.events.WatchResult`.

    Raises:
        ConfigError: a bad key or value, before anything is installed.
    """
    from opscope.config import watch_config
    from opscope.report import renderer
    from opscope.watch.session import WatchSession

    return WatchSession(watch_config(config, action=action, **keys), report=renderer("OverflowEvent", "text"))


def monitor(path: str | os.PathLike | None = None, *, config: Any = None, model: Any = None,
            optimizer: Any = None, flight: Any = None, **keys: Any) -> MonitorSession:
    """Follow training-state statistics every step; name the earliest tensor that moved.

    Use as a context manager around the loop, with ``m.step(loss=loss)`` at each step's end
    (or let opscope end steps at ``optimizer.step()``), or ``start()``/``stop()``.

    Args:
        path: folder for the time series, events and ``report.html`` (default
            ``opscope-monitor``); or ``"path"`` in the config's ``monitor`` section.
        config: a config file or mapping with a ``monitor`` section; ``$OPSCOPE_CONFIG`` if None.
        model: the model to hook (default: the first module called in the first step).
        optimizer: the optimizer to hook (default: every optimizer that steps).
        flight: an ``opscope.watch(action="record")`` session whose flight recorder an event triggers.
        **keys: ``every``, ``targets``, ``modules``, ``ranks``, ``window``, ``threshold``,
            ``warmup``, ``move_decades``, ``loss_rise``, ``chunk``, ``report``, ``overwrite``,
            ``enable``, ``tensorboard`` (see docs/monitor.md).

    Returns:
        A :class:`~opscope.monitor.session.MonitorSession`; its ``stop()`` returns the
        :class:`~opscope.monitor.events.MonitorData` written (False when something moved).

    Raises:
        ConfigError: a bad key or value, before anything is installed.
    """
    from opscope.config import monitor_config
    from opscope.monitor.session import MonitorSession
    from opscope.report import renderer

    cfg = monitor_config(config, path=path, **keys)
    return MonitorSession(cfg, report=renderer("MonitorEvent", "text"), html=renderer("MonitorData", "html"),
                          model=model, optimizer=optimizer, flight=flight)


# The entry points by name. ``opscope.profile`` and ``opscope.watch`` are also packages: once a
# submodule of one is imported, Python binds the package to that name here, hiding the
# function; the package is then callable and forwards to the function kept here.
ENTRY_POINTS: dict[str, Callable[..., Any]] = {"profile": profile, "watch": watch, "monitor": monitor}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'opscope' has no attribute {name!r}")
