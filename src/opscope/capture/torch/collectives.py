"""torch.distributed's Python collectives, wrapped while an aten-level dump runs.

A collective's effect is recorded through its c10d op (``c10d._reduce_scatter_base_``): its
outputs are measured at their next read (model/records.py ``COLLECTIVE_NOTE``). Some backends
do part of the work in further ops on the calling thread, inside the Python call: gloo's
reduce-scatter all-reduces into a buffer of its own, then splits it and copies this rank's
part into the output. Recorded, that buffer looked like a value no op made, and every other
rank's divergence a root of this rank. Inside the call (:class:`CollectiveCalls` marks it),
ops other than the c10d op itself are the collective's own work, handled as the ops of its
worker threads are: not recorded, what they write counted, and what they fill from the
collective's result holding that result.

The functions are replaced on ``torch.distributed`` and ``torch.distributed.distributed_c10d``
while the dump runs, and put back when it stops; a caller that imported one by name before the
dump started keeps the original (its extra ops, if any, are then recorded).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

NAMES = ("all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_coalesced", "all_gather_into_tensor",
         "all_gather_single", "_all_gather_base", "reduce_scatter", "reduce_scatter_tensor",
         "reduce_scatter_single", "_reduce_scatter_base", "all_to_all", "all_to_all_single", "broadcast",
         "reduce", "gather", "scatter", "send", "recv", "isend", "irecv", "batch_isend_irecv")


class CollectiveCalls:
    """Wraps the collectives of ``torch.distributed``: ``enter(1)`` before each call, ``enter(-1)`` after."""

    def __init__(self, enter: Callable[[int], None]) -> None:
        self._enter = enter
        self._originals: list[tuple[Any, str, Any]] = []

    def install(self) -> None:
        if self._originals:
            return
        try:
            import torch.distributed as dist
            from torch.distributed import distributed_c10d
        except ImportError:  # a torch built without distributed
            return
        if not dist.is_available():
            return
        wrapped: dict[int, Any] = {}
        for module in (dist, distributed_c10d):
            for name in NAMES:
                original = module.__dict__.get(name)
                if not callable(original):
                    continue
                if id(original) not in wrapped:
                    wrapped[id(original)] = self._wrap(original)
                self._originals.append((module, name, original))
                setattr(module, name, wrapped[id(original)])

    def remove(self) -> None:
        for module, name, original in reversed(self._originals):
            setattr(module, name, original)
        self._originals = []

    def _wrap(self, function: Any) -> Any:
        enter = self._enter

        @functools.wraps(function)
        def collective(*args: Any, **kwargs: Any) -> Any:
            enter(1)
            try:
                return function(*args, **kwargs)
            finally:
                enter(-1)

        collective.__opscope_wrapped__ = function  # type: ignore[attr-defined]
        return collective
