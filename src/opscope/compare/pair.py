"""The pair: one aligned tensor pair of two dumps (or one unpaired record), and op calls."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from opscope.config import PHASES

# Where a phase's records fall in a step, for ordering: a recomputation (activation
# checkpointing) runs inside the backward, so its records order with the backward's by seq
PHASE_ORDER = {phase: i for i, phase in enumerate(PHASES)} | {"recompute": PHASES.index("backward")}
INPUT_IO = ("input", "param", "grad")
SIDES = ("target", "reference")  # the two dumps of a comparison, in the order they are given


@dataclass(slots=True)  # one per tensor pair: no __dict__ each (~100 bytes less a pair)
class Pair:
    """One aligned tensor pair (or one unpaired record, with the other side None).

    ``kind``: exact | aligned | mapped | flow | identity | unpaired. For ``identity`` the
    op ran on ``side`` only and its output is compared with the other side's input. An
    aligned pair with a ``side`` is that side's recomputation of a forward (activation
    checkpointing) against the other side's forward: it belongs to that side's call.
    """

    t: dict[str, Any] | None
    r: dict[str, Any] | None
    kind: str
    side: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    mode: str = ""
    status: str = ""
    verdict: str = ""
    error: float = math.nan
    tolerance: float = math.nan
    note: str = ""

    @property
    def home(self) -> dict[str, Any]:
        """The row that places this pair in execution order (target's, unless target-less)."""
        # a side: an identity, or a recomputation judged against the other side's forward
        row = (self.t if self.side == "target" else self.r) if self.side else (self.t if self.t is not None else self.r)
        if row is None:
            raise ValueError(f"a {self.kind} pair without the row that places it")
        return row

    @property
    def rows(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Target's and reference's rows of a two-sided pair (every measured pair is one)."""
        if self.t is None or self.r is None:
            raise ValueError(f"a one-sided {self.kind} pair has no row on one side")
        return self.t, self.r


def call_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """The call a row belongs to: (phase, module, op, call index), or its own seq where the
    row has no call index. Records of one call written at different times (a module's entry
    and exit, an optimizer's parameter before and after) share it."""
    call = row.get("call")
    return ("seq", row["seq"]) if call is None else (row.get("phase"), row.get("module"), row.get("op"), call)


@dataclass
class OpCall:
    side: str
    seq: int
    phase: str
    module: str
    op: str
    rows: list[dict[str, Any]]

    def outputs(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r.get("io") == "output"]

    def inputs(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r.get("io") in INPUT_IO]
