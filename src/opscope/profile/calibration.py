"""How fast and how busy the machine was during a profile, so that ``diff`` can tell a
busier machine from slower code.

Two measurements, both on the thread that runs the training loop:

* **sched wait** (Linux): the time the thread was ready to run but waiting for a CPU,
  read from ``/proc/thread-self/schedstat`` (``run_delay``) at every step boundary and
  stored per step (``sched_wait_ns``); on the host clock also at the phase timers' marks
  (at most one read per :func:`read_gap_ns`), which splits it by phase (``<phase>_wait_ns``).
  On a shared machine this is where most of a busier machine's cost goes: the thread is
  preempted, or wakes from a sleep and queues behind other processes.
* **calibration**: a fixed CPU workload in two parts, a pure-Python loop and small float32
  matmuls, each timed :data:`ROUNDS` times at the start and at the end of the profile,
  outside every step (~15 ms in all). A round's time is its wall time minus its own sched
  wait, so it measures the *speed* of the CPU while running (frequency, a busy SMT
  sibling, cache contention, hypervisor steal), not the queueing the step wait counts.

Nothing here imports torch at module level: reading and diffing profiles must not.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import os
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opscope.profile.breakdown import breakdown

VERSION = 2  # 2: the run-queue wait read inside each round's timed window (Calibration._timed)
ROUNDS = 9
PY_LOOP = 20_000
MM_SIZE, MM_REPEAT = 48, 40
WORKLOAD = f"python loop of {PY_LOOP} + {MM_REPEAT} float32 matmuls {MM_SIZE}x{MM_SIZE}"
SCHEDSTAT = "/proc/thread-self/schedstat"
GAP_NS = 50_000  # phase timer marks closer than this to the last read reuse it (at least)
STAMP_TRIES = 3  # reads of the wait at one mark when the thread is put back in the queue during one
READS_SHARE = 200  # ... and closer than this many times one read's cost: reads take <= 0.5%
MAD_TO_SIGMA = 1.4826
MEDIAN_SE = 1.2533
MACHINE_MIN = 0.03  # a speed difference under 3% is left to the floors of the diff
MACHINE_K = 2.0  # z-score for calling the speed ratio a difference at all


class SchedWait:
    """Cumulative run-queue wait (ns) of the thread that opened it; :meth:`read` costs ~2 us."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def open(cls) -> SchedWait | None:
        """A reader for the calling thread, or ``None`` where the kernel does not say."""
        try:
            fd = os.open(SCHEDSTAT, os.O_RDONLY)
        except OSError:
            return None
        reader = cls(fd)
        try:
            reader.read()
        except (OSError, ValueError, IndexError):
            reader.close()
            return None
        return reader

    def read(self) -> int:
        """Nanoseconds this thread has waited for a CPU since it started."""
        return int(os.pread(self.fd, 128, 0).split()[1])

    def close(self) -> None:
        """Release the file descriptor (idempotent)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def stamped_read(read: Callable[[], int], clock: Callable[[], int], tight_ns: int,
                 before: int | None = None) -> tuple[int, int]:
    """``(mark, wait)``: the wait ``read`` between two marks of ``clock`` less than
    ``tight_ns`` apart (``before``: the first, if just taken), so it is the wait at the mark
    to within that. A thread put back in the run queue during the read (the exit of the
    system call is where it most often is) waited before the kernel counted or after: read
    again, up to :data:`STAMP_TRIES` times in all."""
    before = clock() if before is None else before
    for _ in range(STAMP_TRIES):
        wait = read()
        now = clock()
        if now - before < tight_ns:
            break
        before = now
    return now, wait


def read_gap_ns(sched: SchedWait, reads: int = 15) -> int:
    """The least time between two wait reads at phase marks: :data:`READS_SHARE` times the
    median cost of one read here, and at least :data:`GAP_NS`."""
    costs = []
    for _ in range(reads):
        start = time.perf_counter_ns()
        sched.read()
        costs.append(time.perf_counter_ns() - start)
    return max(GAP_NS, READS_SHARE * sorted(costs)[len(costs) // 2])


class WaitTimeline:
    """The run-queue wait sampled at clock marks, to split a step's wait by phase.

    A mark within ``gap_ns`` of the last read reuses it, so the wait at any mark is known
    to within that (the wait cannot grow faster than the clock) and the reads cost at most
    1/``READS_SHARE`` of the time between marks. ``gap_ns`` (:func:`read_gap_ns`) follows
    what a read costs on this machine: ~1 us on a quiet one, 6 us on a loaded VM, where a
    fixed 20 us gap made the reads 90 us of a 200 us step (and 1/40 of a read's cost, 2.5%
    of the time between marks, was still too much for a 1.03x goal: now 1/200).
    """

    def __init__(self, sched: SchedWait, mark: Callable[[], int], gap_ns: int = GAP_NS) -> None:
        self._read, self._mark = sched.read, mark
        self.gap_ns = gap_ns
        self.times: list[int] = []  # clock ns of each read, ascending
        self.waits: list[int] = []  # cumulative wait ns read then (two lists: bisect runs in C)
        self._last = -gap_ns

    def mark(self) -> int:
        """The wrapped clock's mark, sampling the wait when the last read is old enough."""
        now = self._mark()
        if now - self._last >= self.gap_ns:
            return self.stamp(now)[0]
        return now

    def stamp(self, before: int | None = None) -> tuple[int, int]:
        """A mark and the wait at it, read now (:func:`stamped_read`, to within the gap).

        A wait read with no mark after it could hold a preemption that the clock put on
        the other side: marked before the read, a phase of 11 ms "waited" 19 ms and the
        next one took 16 ms with no wait; marked after, the same at the read's own exit."""
        now, wait = stamped_read(self._read, self._mark, self.gap_ns, before)
        self._last = now
        self.times.append(now)
        self.waits.append(wait)
        return now, wait

    def at(self, t: int) -> int:
        """Cumulative wait (ns) at clock time ``t``: the last read at or before it."""
        if not self.times:
            return 0
        return self.waits[max(bisect.bisect_right(self.times, t) - 1, 0)]

    def phases(self, start: int, end: int, intervals: Mapping[str, Sequence[tuple[int, int]]]) -> dict[str, int]:
        """Wait (ns) per exclusive phase of the step ``[start, end]``: the same breakdown as
        the phase times, on the wait's timeline (the map from clock to wait only grows)."""
        at = self.at
        waits, _, _ = breakdown(at(start), at(end),
                                {p: [(at(a), at(b)) for a, b in ivs] for p, ivs in intervals.items() if ivs})
        return waits

    def trim(self, before: int) -> None:
        """Forget the reads older than the last one at or before ``before``."""
        keep = max(bisect.bisect_right(self.times, before) - 1, 0)
        del self.times[:keep]
        del self.waits[:keep]


def _python_part() -> None:
    total = 0
    for i in range(PY_LOOP):
        total += i * i


def _matmul_part() -> Any:
    """The matmul part as a function, or ``None`` where torch does not import."""
    try:
        import torch

        with unobserved():
            generator = torch.Generator().manual_seed(0)
            x = torch.rand(MM_SIZE, MM_SIZE, generator=generator)
            y = torch.rand(MM_SIZE, MM_SIZE, generator=generator)
    except Exception:  # noqa: BLE001 - a calibration without torch is still a calibration
        return None

    def part() -> None:
        with unobserved():
            for _ in range(MM_REPEAT):
                x.mm(y)

    return part


@contextlib.contextmanager
def unobserved() -> Iterator[None]:
    """opscope's own torch ops, kept out of a dump or watch running in the same process:
    no dispatch or function mode (the Python capture levels) sees them, and the native
    observers skip ops run with Python dispatch excluded. The calibration then also times
    the machine, not the capture."""
    import torch

    with torch._C._DisableTorchDispatch(), torch._C.DisableTorchFunction():
        yield


class Calibration:
    """The calibration of one rank: per part, rounds at ``start`` and at ``end``, in ms."""

    def __init__(self, sched: SchedWait | None) -> None:
        self.sched = sched
        self.rounds: dict[str, dict[str, list[float]]] = {}
        self.loadavg: dict[str, float] = {}
        self.error: str | None = None
        self._parts: dict[str, Any] | None = None

    def run(self, when: str) -> None:
        """Time :data:`ROUNDS` rounds of each part (after one untimed round); never raises."""
        try:
            if self._parts is None:
                matmul = _matmul_part()
                self._parts = {"python": _python_part} | ({"matmul": matmul} if matmul else {})
            for part in self._parts.values():
                part()
            timed: dict[str, list[float]] = {name: [] for name in self._parts}
            for _ in range(ROUNDS):
                for name, part in self._parts.items():
                    timed[name].append(self._timed(part))
            for name, values in timed.items():
                self.rounds.setdefault(name, {})[when] = values
            self.loadavg[when] = round(os.getloadavg()[0], 2)
        except Exception as exc:  # noqa: BLE001 - calibration must never break a profile
            self.error = f"{type(exc).__name__}: {exc}"

    def _timed(self, part: Any) -> float:
        # The wait is read inside the timed window: a wait counted between the two reads ended
        # within it, so it never exceeds the window (read outside, a preemption just before the
        # first read or after the clock stopped was taken off time that did not hold it: rounds
        # of 0 or less under load).
        start = time.perf_counter_ns()
        wait = self.sched.read() if self.sched is not None else 0
        part()
        waited = self.sched.read() - wait if self.sched is not None else 0
        return round((time.perf_counter_ns() - start - waited) / 1e6, 4)

    def to_json(self) -> dict[str, Any]:
        """The ``calibration`` block of a rank's ``summary.json``."""
        threads = None
        try:
            import torch

            threads = torch.get_num_threads()
        except Exception:  # noqa: BLE001
            pass
        block = {"version": VERSION, "workload": WORKLOAD, "rounds_ms": self.rounds,
                 "sched_wait": self.sched is not None, "loadavg": self.loadavg, "torch_threads": threads}
        if self.error:
            block["error"] = self.error
        return block


@dataclass
class Speed:
    """Calibration round time of B over A: above 1, B's machine was slower."""

    ratio: float
    sigma: float  # standard uncertainty of log(ratio)
    significant: bool

    @property
    def factor(self) -> float:
        """The ratio when it is a real difference, else 1 (no correction)."""
        return self.ratio if self.significant else 1.0


def _log_center(blocks: Iterable[dict[str, Any]], part: str) -> tuple[float, float] | None:
    """Median log round time of one part in one profile, and its uncertainty (the median's
    standard error and half the drift between the start and end windows)."""
    windows = [[math.log(v) for v in values if v > 0] for b in blocks
               for values in b.get("rounds_ms", {}).get(part, {}).values()]
    windows = [w for w in windows if w]
    if not windows:
        return None
    medians = [statistics.median(w) for w in windows]
    residuals = [v - m for w, m in zip(windows, medians, strict=True) for v in w]
    sigma = MAD_TO_SIGMA * statistics.median(abs(r) for r in residuals) if len(residuals) > 1 else 0.0
    se = MEDIAN_SE * sigma / math.sqrt(len(residuals))
    drift = (max(medians) - min(medians)) / 2
    return statistics.median([v for w in windows for v in w]), math.hypot(se, drift)


def compatible(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> str | None:
    """Why the calibrations of A and B cannot be compared, or ``None`` when they can."""
    for label, blocks in (("A", a), ("B", b)):
        if not blocks:
            return f"{label} has no machine calibration (written by an older opscope)"
    workloads = {blk.get("workload") for blk in (*a, *b)}
    if len(workloads) > 1:
        return "A and B ran different calibration workloads (different opscope versions)"
    return None


def speed(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> Speed | None:
    """The machine-speed ratio B/A: the mean over the workload's parts of each part's ratio.

    A machine that is slower moves every part; the parts disagreeing is noise of another
    kind (a Python loop alone varies a few percent from process to process with memory
    layout), so half their spread is part of the uncertainty, and the ratio is called
    significant only when every part moved the same way.
    """
    ratios, sigmas = [], []
    for part in ("python", "matmul"):
        ca, cb = _log_center(a, part), _log_center(b, part)
        if ca is not None and cb is not None:
            ratios.append(cb[0] - ca[0])
            sigmas.append(math.hypot(ca[1], cb[1]))
    if not ratios:
        return None
    log_ratio = statistics.fmean(ratios)
    sigma = math.hypot(math.sqrt(sum(x * x for x in sigmas)) / len(sigmas), (max(ratios) - min(ratios)) / 2)
    same_way = all(r * log_ratio > 0 for r in ratios)
    significant = same_way and abs(log_ratio) > MACHINE_K * sigma and abs(math.expm1(log_ratio)) >= MACHINE_MIN
    return Speed(round(math.exp(log_ratio), 4), round(sigma, 4), significant)
