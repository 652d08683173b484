"""What ``opscope.watch`` found: plain data, no torch (reporters read it, tests build it).

An :class:`OverflowEvent` is one hit: the op whose output was abnormal, where it ran, the
statistics of its inputs, and the chain back to the earliest op whose output was already
abnormal. ``opscope.report.overflow_console.render(event)`` turns it into text.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

# Why an output is abnormal, most severe first.
KINDS = ("nan", "inf", "-inf", "limit", "loss_spike", "time_spike")


@dataclass
class TensorSummary:
    """Statistics of one tensor (an op's input or output) at the time of the hit.

    ``origin`` says where the tensor came from: ``"aten.var.correction in layers.0"``,
    ``"parameter layers.0.fc1.weight"``, ``"model input"``, ``"not produced by a watched op"``.
    Fields are None when the tensor was already freed (only the range is then known).
    """

    slot: int
    name: str | None = None
    dtype: str | None = None
    shape: list[int] | None = None
    min: float | None = None
    max: float | None = None
    mean: float | None = None
    std: float | None = None
    nan: int | None = None
    inf: int | None = None
    zeros: int | None = None
    origin: str | None = None

    @property
    def finite(self) -> bool | None:
        if self.nan is not None or self.inf is not None:
            return not (self.nan or self.inf)
        if self.min is None or self.max is None:
            return None
        return math.isfinite(self.min) and math.isfinite(self.max)


@dataclass
class ChainLink:
    """One op on the way from the earliest abnormal output to the hit.

    ``reason`` says what was abnormal about this op's output as its consumer saw it:
    ``"NaN"``, ``"Inf"``, ``"beyond limit 65504"``, ``"large values feeding exp"``,
    ``"zeros feeding a division"``, or ``"first NaN/Inf"`` for the op where it starts.
    """

    op: str
    module: str
    phase: str
    reason: str
    min: float | None = None
    max: float | None = None
    fwd_op: str | None = None


@dataclass
class OverflowEvent:
    """One abnormal output seen by ``opscope.watch``.

    Args:
        kind: one of :data:`KINDS`.
        op: the aten op (aten level), the module class (module level), or ``<loss>``,
            ``<grad>``, ``<param>``, ``<model input>``, ``<step time>`` for step-level checks.
        module: module path (``""`` = outside any module); in backward, the forward module
            whose autograd node ran.
        phase: ``forward``, ``backward`` or ``optimizer``.
        step, rank: where it happened.
        level: ``aten`` or ``module``.
        nan, inf: element counts in the abnormal output (None when not measured).
        min, max: range of the abnormal output.
        source: the user's ``file:line (function)`` when known.
        fwd_op, node: backward only: the forward op and autograd node being executed.
        param: parameter name for ``<grad>`` / ``<param>`` events.
        inputs: statistics of the op's inputs.
        chain: from the earliest abnormal op to this one (the last link is this op).
        limit: the configured limit, if any.
        detail: a sentence for step-level triggers (loss value and its median, ...).
    """

    kind: str
    op: str
    module: str
    phase: str
    step: int
    rank: int
    level: str = "aten"
    dtype: str | None = None
    shape: list[int] | None = None
    nan: int | None = None
    inf: int | None = None
    min: float | None = None
    max: float | None = None
    source: str | None = None
    fwd_op: str | None = None
    node: str | None = None
    param: str | None = None
    inputs: list[TensorSummary] = field(default_factory=list)
    chain: list[ChainLink] = field(default_factory=list)
    limit: float | None = None
    detail: str | None = None

    @property
    def origin(self) -> ChainLink | None:
        """The earliest op whose output was already abnormal (the first chain link)."""
        return self.chain[0] if self.chain else None

    @property
    def chain_ops(self) -> list[str]:
        """Op names on the chain (for capturing them with full tensors)."""
        ops = [link.op for link in self.chain] or [self.op]
        return list(dict.fromkeys(op for op in ops if not op.startswith("<")))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class WatchResult:
    """What a finished ``opscope.watch`` saw: ``stop()`` returns it.

    ``events`` are the hits where a NaN/Inf (or a value beyond the limit, or a spike) started,
    in order; ``dumps`` the flight-recorder dumps written; ``bool(result)`` is True when
    nothing was found.
    """

    events: list[OverflowEvent] = field(default_factory=list)
    dumps: list[str] = field(default_factory=list)
    steps: int = 0

    def __bool__(self) -> bool:
        return not self.events

    def __call__(self) -> WatchResult:
        """``w.result()``, the spelling before ``result`` became an attribute (as on profile
        and dump sessions): still works, with a DeprecationWarning, until the next release."""
        warnings.warn("w.result is an attribute now (as p.result and d.result): write w.result, "
                      "not w.result(); the call form goes in the next release", DeprecationWarning, stacklevel=2)
        return self
