from __future__ import annotations

import pytest

from opscope.profile.clock import DeviceClock, HostClock, pick_clock


class FakeEvent:
    """A timing event whose device time is set by the test (ms since the first event)."""

    now_ms = 0.0

    def __init__(self) -> None:
        self.t = None
        self.synced = False

    def record(self) -> None:
        self.t = FakeEvent.now_ms

    def synchronize(self) -> None:
        self.synced = True

    def elapsed_time(self, other: FakeEvent) -> float:
        return other.t - self.t


def test_device_clock_resolves_events_on_device_time() -> None:
    FakeEvent.now_ms = 0.0
    clock = DeviceClock(FakeEvent, "cuda")
    FakeEvent.now_ms = 2.5
    token = clock.mark()
    clock.ready(token)
    assert token[1].synced
    assert clock.resolve(token) - clock.resolve((0, clock._base)) == 2_500_000
    assert clock.host(token) == token[0]


def test_host_clock_marks_are_monotonic_ints() -> None:
    clock = HostClock()
    a, b = clock.mark(), clock.mark()
    assert isinstance(a, int) and b >= a and clock.resolve(a) == a


def test_pick_clock_on_cpu_only_machine() -> None:
    assert pick_clock("host").name == "host"
    pytest.importorskip("torch")
    import torch

    if not torch.cuda.is_available():
        assert pick_clock("auto").name == "host"
        with pytest.raises(Exception, match="cuda"):
            pick_clock("cuda")
