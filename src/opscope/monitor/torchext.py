"""The monitor's torch extension (``monitor/_c/montorch.cpp``), built against the installed
torch on first use (or by ``python -m opscope.capture.torch.native.build``, which the install
script runs) by :mod:`opscope.capture.torch.native.build` (cached per torch version and
source, as the dump's observers are): the gradients' arguments for the batched kernel read
from the tensors' C++ fields, one call for all of them (:func:`opscope.monitor.stats.background_grads`).
Without a compiler the monitor takes its Python path (the same statistics) and says why once.
"""

from __future__ import annotations

import logging
from types import ModuleType

NAME = "_opscope_monitor"
log = logging.getLogger("opscope.monitor")
_said: list[bool] = []


def load() -> ModuleType | None:
    """The extension, built if needed; None when it cannot be (said once, at info level)."""
    from opscope.capture.torch.native import build

    module = build.load(NAME)
    if module is None and not _said:
        _said.append(True)
        log.info("opscope monitor: the torch extension is not available (%s); gradients are handed to the "
                 "statistics kernel from Python", build.error(NAME))
    return module
