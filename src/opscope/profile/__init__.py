"""opscope.profile: training trace (phase timers), task trace (torch.profiler), summary, diff.

``opscope.profile`` is both this package and the function that starts a profile: once a
submodule such as ``opscope.profile.diff`` is imported, Python binds the package to the
name ``profile`` on ``opscope``, hiding the lazily imported function. So the package itself
is callable and forwards to :func:`opscope.profile`, which lives with the public API in
``opscope/__init__.py`` (it hands the session its HTML renderer from :mod:`opscope.report`).
"""

from __future__ import annotations

from opscope._callable import callable_package

callable_package(__name__, "opscope:ENTRY_POINTS")
