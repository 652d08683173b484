"""Clocks for the phase timers.

The host clock is ``time.perf_counter_ns``. A device clock (CUDA, or NPU through
``torch.npu``) records an event on the current stream at each mark, together with the host
time; events are resolved to nanoseconds once per step, one step late, so the timers never
force the host to wait for the device in the middle of a step.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

Token = Any


class HostClock:
    """Marks are host ``perf_counter_ns`` integers."""

    name = "host"
    is_device = False

    def __init__(self) -> None:
        self.mark: Callable[[], int] = time.perf_counter_ns

    @staticmethod
    def host(token: int) -> int:
        """Host nanoseconds of a mark."""
        return token

    @staticmethod
    def resolve(token: int) -> int:
        """Nanoseconds of a mark on the clock's own timeline."""
        return token

    def ready(self, token: Any) -> None:
        """Block until ``token`` can be resolved (nothing to wait for on the host)."""


class DeviceClock:
    """Marks are ``(host_ns, event)``; resolved to device-timeline ns relative to a base event.

    Args:
        event_factory: makes a timing event with ``record()``, ``synchronize()`` and
            ``elapsed_time(other) -> ms`` (``torch.cuda.Event(enable_timing=True)``).
        name: ``"cuda"`` or ``"npu"``.
    """

    is_device = True

    def __init__(self, event_factory: Callable[[], Any], name: str = "cuda") -> None:
        self.name = name
        self._new_event = event_factory
        self._base = self._new_event()
        self._base.record()
        self._base_host = time.perf_counter_ns()

    def mark(self) -> tuple[int, Any]:
        """Record an event on the current stream now."""
        event = self._new_event()
        event.record()
        return (time.perf_counter_ns(), event)

    @staticmethod
    def host(token: tuple[int, Any]) -> int:
        """Host nanoseconds of a mark."""
        return token[0]

    def ready(self, token: tuple[int, Any]) -> None:
        """Block until the device has passed ``token``'s event."""
        token[1].synchronize()

    def resolve(self, token: tuple[int, Any]) -> int:
        """Device-timeline nanoseconds of a mark, on the same origin as host marks."""
        return self._base_host + round(self._base.elapsed_time(token[1]) * 1e6)


def pick_clock(kind: str = "auto") -> HostClock | DeviceClock:
    """The clock for ``kind`` (``auto``, ``host``, ``cuda``, ``npu``).

    ``auto`` takes the device clock when CUDA (or torch_npu) is initialised in this
    process, which is the case once the model has been moved to the device.
    """
    if kind == "host":
        return HostClock()
    import torch

    for name in ("cuda", "npu"):
        backend = getattr(torch, name, None)
        if backend is None or not hasattr(backend, "Event"):
            continue
        usable = backend.is_available() and (kind == name or backend.is_initialized())
        if usable and kind in ("auto", name):
            return DeviceClock(functools.partial(backend.Event, enable_timing=True), name)
    if kind in ("cuda", "npu"):
        from opscope.errors import ConfigError

        raise ConfigError(f"clock: {kind!r} was asked for but torch.{kind} is not available here; use "
                          "\"auto\" or \"host\"")
    return HostClock()
