"""The run-queue wait reads follow what a read costs here (a fake clock, the real reader)."""

from __future__ import annotations

import pytest

from opscope.profile.calibration import GAP_NS, READS_SHARE, SchedWait, WaitTimeline, read_gap_ns


class Reads:
    def __init__(self) -> None:
        self.count = 0

    def read(self) -> int:
        self.count += 1
        return self.count * 10


def test_marks_closer_than_the_gap_reuse_the_last_read() -> None:
    ticks = iter(range(0, 1_000_000, 10_000))  # a mark every 10 us
    reads = Reads()
    timeline = WaitTimeline(reads, lambda: next(ticks), gap_ns=60_000)  # type: ignore[arg-type]
    for _ in range(60):
        timeline.mark()
    assert reads.count == 10  # one read per 6 marks
    assert timeline.at(65_000) == 20 and timeline.at(59_999) == 10


def test_the_gap_is_forty_reads_and_at_least_twenty_microseconds() -> None:
    sched = SchedWait.open()
    if sched is None:
        pytest.skip("no /proc/thread-self/schedstat here")
    try:
        gap = read_gap_ns(sched)
    finally:
        sched.close()
    assert gap >= GAP_NS and (gap == GAP_NS or gap % READS_SHARE == 0)
