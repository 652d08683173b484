"""``opscope.watch``: catch the first operator that makes NaN or Inf, cheaply enough to leave on.

The package, beside ``capture`` (whose hooks it uses) and below ``report``:

- :mod:`~opscope.watch.session` — :class:`WatchSession`: hooks, steps, actions;
- :mod:`~opscope.watch.check` — the per-op check (Python dispatch mode) and its entries;
- :mod:`~opscope.watch.observer` — the same check run by the native observer (``capture/torch/_c``);
- :mod:`~opscope.watch.chain` — from a hit to an event: inputs and the chain back;
- :mod:`~opscope.watch.step_checks` — loss and step-time spikes;
- :mod:`~opscope.watch.flight` — the flight recorder, which holds a dump session;
- :mod:`~opscope.watch.events` — what it finds, as plain data.

Events reach the user as text through a reporter callable the session is handed; this
module's :func:`watch` hands it the ``text`` renderer of :mod:`opscope.report`.

``opscope.watch`` is both this package and the function that starts a watch (as
``opscope.profile`` is): once a submodule is imported, Python binds the package to the name
``watch`` on ``opscope``, so the package itself is callable and forwards to :func:`watch`.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opscope.watch.session import WatchSession


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
    from opscope.report import overflow_console
    from opscope.watch.session import WatchSession

    return WatchSession(watch_config(config, action=action, **keys), report=overflow_console.render)


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return watch(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
