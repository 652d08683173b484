"""What ``opscope.monitor`` finds and keeps: plain data, no torch (reporters read it, tests build it).

A :class:`Departure` is one tracked series leaving its band at one step; a
:class:`MonitorEvent` is every departure of one step, ordered by where the series is made
in the step (``order``), so ``event.first`` is the earliest tensor that moved, not the
largest symptom. :class:`MonitorData` is a whole monitor folder as read back.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

# The statistics of each tensor, in the order the engines return them (opscope.monitor.stats).
STATS = ("norm", "max", "nan", "inf")

# Where each kind of series is made in a step, earliest first (config.TARGETS' order).
# Gradients of activations and of parameters share a class: backward interleaves them, and
# their positions come from one counter (the order backward made them in). Under DDP a rank's
# own gradients (grad_local) take their parameter's place and the all-reduced ones (grad)
# come after all of them (the session adds an offset to their places).
KIND_ORDER = {"input": 0, "activation": 1, "loss": 2, "activation_grad": 4, "grad_local": 4, "grad": 4, "lr": 5,
              "exp_avg": 6, "exp_avg_sq": 6, "momentum_buffer": 6, "state": 6, "weight": 7}


@dataclass
class Departure:
    """One series out of its band: ``value`` against the window's ``median`` (both in the
    series' own units), ``z`` the robust z-score (inf for a NaN/Inf), ``reason`` in words."""

    kind: str
    name: str
    stat: str
    value: float
    median: float
    z: float
    order: int
    reason: str

    @property
    def label(self) -> str:
        """``layers.1.fc2.weight (grad)``, ``loss``, ``lr``."""
        if self.kind in ("loss", "lr") or not self.name:
            return self.name or self.kind
        return f"{self.name} ({self.kind.replace('_', ' ')})"

    @property
    def factor(self) -> float:
        """How many times the median the value is (inf/nan when that has no meaning)."""
        if not math.isfinite(self.value) or self.median == 0:
            return math.inf
        return self.value / self.median


@dataclass
class MonitorEvent:
    """Every series that left its band at ``step`` (rank ``rank``), earliest in the step first."""

    step: int
    rank: int
    departures: list[Departure] = field(default_factory=list)
    note: str | None = None

    @property
    def first(self) -> Departure:
        return self.departures[0]

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "rank": self.rank, "note": self.note,
                "departures": [_clean(asdict(d)) for d in self.departures]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MonitorEvent:
        deps = [Departure(kind=str(d["kind"]), name=str(d["name"]), stat=str(d["stat"]), value=_float(d["value"]),
                          median=_float(d["median"]), z=_float(d["z"]), order=int(d["order"]), reason=str(d["reason"]))
                for d in data.get("departures", [])]
        return cls(step=int(data["step"]), rank=int(data.get("rank", 0)), departures=deps, note=data.get("note"))


@dataclass
class RankSeries:
    """One rank's time series: ``values[(kind, name, stat)] = (steps, values)`` as lists,
    ``order[(kind, name)]`` where the series is made in a step, ``events`` found online."""

    rank: int
    values: dict[tuple[str, str, str], tuple[list[int], list[float]]]
    order: dict[tuple[str, str], int]
    events: list[MonitorEvent]
    status: str
    steps: int

    def series(self, kind: str, stat: str = "norm") -> list[str]:
        """Names of the series of ``kind`` that have ``stat``, in step order."""
        names = {n for k, n, s in self.values if k == kind and s == stat}
        return sorted(names, key=lambda n: (self.order.get((kind, n), 1 << 30), n))


@dataclass
class MonitorData:
    """A monitor folder as read back: its config and each rank's series and events."""

    path: str
    config: dict[str, Any]
    ranks: dict[int, RankSeries]

    @property
    def events(self) -> list[MonitorEvent]:
        return [e for r in sorted(self.ranks) for e in self.ranks[r].events]

    def __bool__(self) -> bool:
        """True when nothing moved (as a compare result is True when nothing diverged)."""
        return not self.events


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and math.isnan(v) else
                ("inf" if v == math.inf else "-inf" if v == -math.inf else v) if isinstance(v, float) else v)
            for k, v in d.items()}


def _float(v: Any) -> float:
    return math.nan if v is None else float(v)
