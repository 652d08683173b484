"""opscope.compare: line two dumps up and name the operator where they start to differ.

:func:`opscope.compare.api.compare` is the entry point. Metrics register in
:mod:`opscope.compare.metrics`, thresholds live in :mod:`opscope.compare.tolerance`, verdict
passes in :mod:`opscope.compare.verdict`. No torch here: numpy and pyarrow only.

This package and the function share the name ``opscope.compare``: once the package is
imported, Python binds ``opscope.compare`` to it, so the package itself is made callable
(``opscope.compare(target, reference)`` works whichever import came first).
"""

from __future__ import annotations

from opscope._callable import callable_package

callable_package(__name__, "opscope.compare.api:compare")
