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
    now = [0]
    reads = Reads()
    timeline = WaitTimeline(reads, lambda: now[0], gap_ns=60_000)  # type: ignore[arg-type]
    for _ in range(60):
        timeline.mark()
        now[0] += 10_000  # a mark every 10 us
    assert reads.count == 10  # one read per 6 marks
    assert timeline.at(65_000) == 20 and timeline.at(59_999) == 10


class Machine:
    """A clock and a run-queue wait that a preemption moves together: ``preempt_next`` puts
    the thread back in the queue for that long during the next read, before the kernel
    counts its wait (the read holds it) or, ``late``, at the system call's exit (it does not)."""

    def __init__(self, late: bool = False) -> None:
        self.now = self.waited = self.preempt_next = 0
        self.late = late

    def clock(self) -> int:
        self.now += 1_000  # 1 us a call
        return self.now

    def read(self) -> int:
        counted = self.waited
        self.now += self.preempt_next
        self.waited += self.preempt_next
        self.preempt_next = 0
        return counted if self.late else self.waited


@pytest.mark.parametrize("late", [False, True], ids=["counted", "at_the_exit"])
def test_a_wait_at_a_mark_is_on_one_side_of_it_on_both_timelines(late: bool) -> None:
    """A 16 ms preemption as the mark between a 1 ms phase and the next one reads the wait
    lies in the first phase's time and wait, never in only one. Marked before the read, the
    first phase waited 16 ms in 1 ms and the second took 16 ms without waiting; marked after
    it, the same when the wait came at the read's exit (seen under load: 16 ms in 0.5 ms)."""
    machine = Machine(late)
    timeline = WaitTimeline(machine, machine.clock, gap_ns=50_000)  # type: ignore[arg-type]
    start = timeline.mark()
    machine.now += 1_000_000  # the first phase's work
    machine.preempt_next = 16_000_000
    middle = timeline.mark()
    machine.now += 2_000_000
    end = timeline.mark()
    waits = timeline.phases(start, end, {"forward": [(start, middle)], "backward": [(middle, end)]})
    assert middle - start >= 17_000_000 and waits["forward"] == 16_000_000
    assert end - middle < 2_100_000 and waits["backward"] == 0
    stamped = timeline.stamp()
    assert stamped == (machine.now, machine.waited) and timeline.at(stamped[0]) == machine.waited


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
