"""Gradient communication timing: torch.distributed collectives and DDP buckets.

Python-level collectives are wrapped for the session (``torch.distributed.all_reduce`` and
friends); an ``async_op=True`` call is timed until its future completes. DDP launches its
bucket all-reduces from C++, so a DDP model gets a communication hook that runs the same
all-reduce as DDP's default and marks when each bucket starts and finishes. DDP has no way
to unregister a hook: after the session it stays as a plain pass-through all-reduce.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "reduce",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "barrier",
)


def patch_collectives(timers: Any) -> list[tuple[Any, str, Any, Any]]:
    """Wrap each collective in ``torch.distributed`` and ``distributed_c10d``; returns the patches."""
    try:
        import torch.distributed as dist

        if not dist.is_available():
            return []
        from torch.distributed import distributed_c10d as c10d
    except ImportError:
        return []
    patches = []
    for name in COLLECTIVES:
        original = c10d.__dict__.get(name)
        if original is None:
            continue
        wrapper = _timed_collective(original, timers)
        for owner in (dist, c10d):
            if getattr(owner, name, None) is original:
                setattr(owner, name, wrapper)
                patches.append((owner, name, original, wrapper))
    return patches


def _timed_collective(original: Any, timers: Any) -> Any:
    @functools.wraps(original)
    def collective(*args: Any, **kwargs: Any) -> Any:
        if not timers.active:
            return original(*args, **kwargs)
        record = [timers.mark(), None]
        timers.add_comm(record)
        try:
            work = original(*args, **kwargs)
        except BaseException:
            record[1] = timers.mark()
            raise
        if kwargs.get("async_op") and work is not None:
            _end_when_done(work, record, timers)
        else:
            record[1] = timers.mark()
        return work

    return collective


def _end_when_done(work: Any, record: list[Any], timers: Any) -> None:
    try:
        future = work.get_future()
    except Exception:  # a backend without futures: count the launch only
        record[1] = timers.mark()
        return

    def done(fut: Any) -> None:
        record[1] = timers.mark()

    future.add_done_callback(done)


def hook_ddp(module: Any, timers: Any) -> str | None:
    """Give a DDP model a timing communication hook; returns a note when that is not possible."""
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:
        return None
    if not isinstance(module, DistributedDataParallel):
        return None
    if getattr(module, "_comm_hooks", None):
        return "DDP already has a communication hook: its bucket all-reduces are not timed"
    ref = weakref.ref(timers)
    try:
        module.register_comm_hook(state=None, hook=_make_ddp_hook(ref))
    except Exception as exc:  # DDP refuses after the first backward, or a custom reducer
        return f"DDP communication hook could not be registered ({exc}): bucket all-reduces are not timed"
    return None


def _make_ddp_hook(ref: Any) -> Any:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    def opscope_allreduce_hook(state, bucket):  # no annotations: DDP inspects them
        timers = ref()
        future = default_hooks.allreduce_hook(state, bucket)
        if timers is None or not timers.active:
            return future
        record = [timers.mark(), None]
        timers.add_comm(record)

        def done(fut):
            record[1] = timers.mark()
            return fut.value()

        return future.then(done)

    return opscope_allreduce_hook
