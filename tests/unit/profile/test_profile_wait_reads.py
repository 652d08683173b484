"""The run-queue wait reads follow what a read costs here (a fake clock, the real reader)."""

from __future__ import annotations

import time

import pytest

from opscope.profile.calibration import GAP_NS, READS_SHARE, Calibration, SchedWait, WaitTimeline, read_gap_ns


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


class PreemptedReads:
    """A thread that waits ``wait_ns`` for a CPU just before each read returns (the kernel
    counts a wait when the thread runs again): the wait of a read lies where the read is."""

    def __init__(self, wait_ns: int) -> None:
        self.wait_ns, self.total = wait_ns, 0

    def read(self) -> int:
        time.sleep(self.wait_ns / 1e9)
        self.total += self.wait_ns
        return self.total


def test_a_calibration_round_is_never_shorter_than_its_own_work() -> None:
    """Only the wait inside a round's timed window is taken off it. Read outside the window, a
    wait of the thread next to a read (a preemption of a few ms, longer than a round) was taken
    off time that did not hold it: rounds of 0 ms or less on a loaded machine. Inside, a wait
    next to a read stays in the round (an outlier the rounds' median absorbs), never below it."""
    calibration = Calibration(PreemptedReads(20_000_000))  # type: ignore[arg-type]
    part_ms = 2.0
    rounds = [calibration._timed(lambda: time.sleep(part_ms / 1e3)) for _ in range(3)]
    assert all(r >= part_ms for r in rounds), rounds
