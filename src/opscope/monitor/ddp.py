"""Each rank's own gradients, before ``DistributedDataParallel``'s all-reduce.

The gradients an optimizer sees under DDP are the average over the ranks: a fault in one
rank's backward shows in every rank's gradients, and the gradients alone cannot say where
it came from. DDP hands each bucket of gradients to a communication hook before reducing
it; the monitor registers one that reads the bucket's gradients (the rank's own, as
backward made them: series of kind ``grad_local``) and then reduces them exactly as DDP
does without a hook (``allreduce_hook``: divide by the group's size, all-reduce, in
place; DDP documents the results as identical). A DDP model that holds a communication
hook already keeps it: DDP accepts one only, so that run has no ``grad_local`` series (a
warning says so).

A DDP hook cannot be removed: after the monitor stops, the hook only reduces.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger("opscope.monitor")
OnBucket = Callable[[list[torch.Tensor], list[torch.Tensor]], None]


def is_ddp(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a ``torch.nn.parallel.DistributedDataParallel``."""
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:  # a torch without distributed support
        return False
    return isinstance(module, DistributedDataParallel)


def install(ddp: Any, on_bucket: OnBucket) -> bool:
    """Register the hook on ``ddp``: ``on_bucket(parameters, gradients)`` for each bucket
    before its all-reduce (exceptions in it are logged, never raised into backward).
    Returns False, with a warning, when ``ddp`` holds a communication hook already."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    def hook(state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        try:
            on_bucket(bucket.parameters(), bucket.gradients())
        except Exception:  # the all-reduce must happen whatever the monitor does
            log.exception("opscope.monitor: reading a gradient bucket before the all-reduce failed")
        return default_hooks.allreduce_hook(state, bucket)

    hook.__qualname__ = "opscope.monitor:allreduce_hook"
    hook.__annotations__ = {}  # DDP compares them with its classes: strings here (postponed annotations)
    if getattr(ddp, "_comm_hooks", None):
        log.warning("opscope.monitor: this DistributedDataParallel model has a communication hook already "
                    "(DDP takes one): gradients are monitored after the all-reduce only")
        return False
    try:
        ddp.register_comm_hook(ddp.process_group, hook)
    except (RuntimeError, ValueError) as exc:  # a built-in hook registered, or backward already ran
        log.warning("opscope.monitor: gradients are monitored after the all-reduce only: DDP refused a "
                    "communication hook (%s)", exc)
        return False
    return True
