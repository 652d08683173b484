"""``opscope.monitor``: training-state statistics every step, and which tensor moved first.

The package, beside ``watch`` and ``profile`` and below ``report``:

- :mod:`~opscope.monitor.session` — :class:`MonitorSession`: hooks, steps, events;
- :mod:`~opscope.monitor.hooks` — the model's inputs, chosen modules' outputs, gradients' order;
- :mod:`~opscope.monitor.stats` — norm, max |x|, NaN/Inf counts of many tensors at once
  (the batched kernel: ``monitor/_c/monstats.c``);
- :mod:`~opscope.monitor.judge` — each finished step judged and written, off the training thread;
- :mod:`~opscope.monitor.detect` — the robust band (median/MAD) every series is judged by;
- :mod:`~opscope.monitor.diagnose` — why a weight turned non-finite (Adam's eps in float16);
- :mod:`~opscope.monitor.ddp` — each rank's own gradients before DDP's all-reduce;
- :mod:`~opscope.monitor.loss` — the loss without code changes (what backward starts from);
- :mod:`~opscope.monitor.tensorboard` — the series as TensorBoard scalars (optional);
- :mod:`~opscope.monitor.series` — the Parquet time series on disk, and its reader;
- :mod:`~opscope.monitor.events` — what it finds and keeps, as plain data.

Nothing here imports a renderer: :func:`opscope.monitor` (the public API) hands the session
the text renderer of events and the HTML renderer of the data. Like ``opscope.watch``,
``opscope.monitor`` is both this package and that function.
"""

from __future__ import annotations

from opscope._callable import callable_package

callable_package(__name__, "opscope:ENTRY_POINTS")
