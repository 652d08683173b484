"""``opscope.watch``: catch the first operator that makes NaN or Inf, cheaply enough to leave on.

The package, beside ``capture`` (whose hooks it uses) and below ``report``:

- :mod:`~opscope.watch.session` — :class:`WatchSession`: hooks, steps, actions;
- :mod:`~opscope.watch.check` — the per-op check (Python dispatch mode) and its entries;
- :mod:`~opscope.watch.observer` — the same check run by the native observer (``capture/torch/native/_c``);
- :mod:`~opscope.watch.chain` — from a hit to an event: inputs and the chain back;
- :mod:`~opscope.watch.step_checks` — loss and step-time spikes;
- :mod:`~opscope.watch.flight` — the flight recorder, which holds a dump session;
- :mod:`~opscope.watch.events` — what it finds, as plain data.

Nothing here imports a renderer: events reach the user as text through the reporter
callable the session is handed. :func:`opscope.watch` (the public API, in
``opscope/__init__.py``) hands it the ``text`` renderer of :mod:`opscope.report`.

``opscope.watch`` is both this package and that function (as ``opscope.profile`` is): once
a submodule is imported, Python binds the package to the name ``watch`` on ``opscope``, so
the package itself is callable and forwards to the function.
"""

from __future__ import annotations

from opscope._callable import callable_package

callable_package(__name__, "opscope:ENTRY_POINTS")
