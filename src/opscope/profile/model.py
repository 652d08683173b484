"""Plain data classes of a profile: no torch, no printing.

Times are integer nanoseconds so that a step's phases plus ``other`` add up to its wall
time exactly; renderers turn them into milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FORMAT = "opscope-profile"
FORMAT_VERSION = 1

# Exclusive phases of a training step, in the order they are shown. ``other`` is the rest.
PHASES = ("data_wait", "forward", "backward", "communication", "optimizer", "zero_grad", "other")

# When two phases overlap, the time goes to the earlier one in this list. Communication
# comes last: a collective running under backward is overlap, not extra time.
PRIORITY = ("data_wait", "zero_grad", "optimizer", "backward", "forward", "communication")

STEP_COLUMNS = (
    "rank",
    "step",
    "start_ns",
    "wall_ns",
    *(f"{p}_ns" for p in PHASES),
    "comm_total_ns",
    "comm_overlap_ns",
    "task_trace",
    "complete",
    "sched_wait_ns",
    *(f"{p}_wait_ns" for p in PHASES),
)

OP_COLUMNS = ("rank", "step", "phase", "name", "shapes", "calls", "total_us", "self_us", "device_us")

Interval = tuple[int, int]


@dataclass
class StepRow:
    """One step of one rank: wall time and its exclusive phases (ns)."""

    rank: int
    step: int
    start_ns: int
    wall_ns: int
    phases: dict[str, int]
    comm_total_ns: int = 0
    comm_overlap_ns: int = 0
    task_trace: bool = False
    complete: bool = True
    sched_wait_ns: int = 0  # ready to run but waiting for a CPU (0 where not measured)
    phase_waits: dict[str, int] | None = None  # sched_wait_ns split by phase; None = unknown

    def to_row(self) -> dict[str, Any]:
        """A flat mapping with the columns of ``steps.parquet``."""
        row: dict[str, Any] = {"rank": self.rank, "step": self.step, "start_ns": self.start_ns, "wall_ns": self.wall_ns}
        for phase in PHASES:
            row[f"{phase}_ns"] = int(self.phases.get(phase, 0))
        row.update(
            comm_total_ns=self.comm_total_ns,
            comm_overlap_ns=self.comm_overlap_ns,
            task_trace=self.task_trace,
            complete=self.complete,
            sched_wait_ns=self.sched_wait_ns,
        )
        for phase in PHASES:  # -1: not split by phase (device clock, no schedstat, older opscope)
            row[f"{phase}_wait_ns"] = -1 if self.phase_waits is None else int(self.phase_waits.get(phase, 0))
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> StepRow:
        """Inverse of :meth:`to_row`."""
        return cls(
            rank=int(row["rank"]),
            step=int(row["step"]),
            start_ns=int(row["start_ns"]),
            wall_ns=int(row["wall_ns"]),
            phases={p: int(row[f"{p}_ns"]) for p in PHASES},
            comm_total_ns=int(row.get("comm_total_ns", 0)),
            comm_overlap_ns=int(row.get("comm_overlap_ns", 0)),
            task_trace=bool(row.get("task_trace", False)),
            complete=bool(row.get("complete", True)),
            sched_wait_ns=int(row.get("sched_wait_ns") or 0),
            phase_waits=_phase_waits(row),
        )


def _phase_waits(row: dict[str, Any]) -> dict[str, int] | None:
    waits: dict[str, int] = {}
    for p in PHASES:
        w = row.get(f"{p}_wait_ns")
        if w is None or w < 0:
            return None
        waits[p] = int(w)
    return waits


@dataclass
class OpRow:
    """One operator name (and input shapes) in one phase of one step: calls and times (us)."""

    rank: int
    step: int
    phase: str
    name: str
    shapes: str
    calls: int
    total_us: float
    self_us: float
    device_us: float = 0.0

    def to_row(self) -> dict[str, Any]:
        """A flat mapping with the columns of ``ops.parquet``."""
        return {c: getattr(self, c) for c in OP_COLUMNS}


@dataclass
class RawStep:
    """What the phase timers saw during one step, before the exclusive breakdown.

    Interval ends are clock tokens (ints on the host clock, event pairs on a device clock).
    """

    step: int
    start: Any
    end: Any = None
    intervals: dict[str, list[tuple[Any, Any]]] = field(default_factory=dict)
    task_trace: bool = False
    complete: bool = True
    wait_start: int = 0  # the thread's cumulative sched wait (ns) when the step began
    wait_ns: int = 0


@dataclass
class ProfileResult:
    """What :meth:`opscope.profile.session.ProfileSession.stop` returns."""

    output: str
    rank: int
    status: str
    steps: list[StepRow]
    summary: dict[str, Any]
    files: list[str]
    warnings: list[str] = field(default_factory=list)
    error: str | None = None

    def __bool__(self) -> bool:
        return self.status == "complete"

    @property
    def step_count(self) -> int:
        """Number of steps recorded on this rank."""
        return len(self.steps)
