"""Results of a replay: plain data that never prints (reporters and the CLI show it).

No torch here: compare results and reporters carry these as dicts (``to_dict``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from opscope.compare.result import json_safe

# Per-op verdicts, in the user's words (also the order of the console legend).
VERDICT_TEXT = {
    "target_wrong": "target wrong",
    "reference_wrong": "reference wrong",
    "both_within": "both within their precision",
    "both_off": "both off",
    "not_replayable": "not replayable",
}


@dataclass
class SideReplay:
    """One side's op, re-run in float64 on that side's own recorded inputs.

    Attributes:
        error: norm-wise relative error of the recorded output against the float64 result
            (worst output of the call).
        units: ``error`` in epsilon of the output's dtype (2**-7 bfloat16, 2**-23 float32).
        native_units: the same for torch's CPU kernel run in the recorded dtypes on the same
            inputs: what a correct kernel in this precision gives here (None: not run).
        allowed_units: the limit ``units`` is held to: max(abs_factor, 4 x native_units).
        status: "ok" (within ``abs_factor`` eps), "ill_conditioned" (beyond it, but no further
            than the CPU kernel in the same precision) or "wrong".
        reproduced: the CPU kernel in the recorded dtypes gives the recorded output bit for bit.
    """

    side: str
    seq: int
    op: str
    module: str
    dtype: str
    error: float
    units: float
    allowed_units: float
    status: str
    native_units: float | None = None
    reproduced: bool | None = None
    outputs: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""
    # the call's non-tensor arguments as recorded, by position ("0") or keyword, as text
    args: dict[str, str] = field(default_factory=dict)


@dataclass
class ReplayResult:
    """The verdict on one op call: which side's output is wrong for its own inputs.

    ``verdict``: "target_wrong", "reference_wrong", "both_within" (each side is right for
    its inputs: the difference was inherited and amplified), "both_off" (both are far from
    float64: the op is ill-conditioned here, or both implementations differ from torch's), or
    "not_replayable" (``reason`` says why and what to do).
    """

    id: str
    rank: int
    step: int
    phase: str
    module: str
    op: str
    verdict: str
    reason: str
    target: SideReplay | None = None
    reference: SideReplay | None = None

    def __bool__(self) -> bool:
        """True when neither side is wrong."""
        return self.verdict in ("both_within", "both_off")

    @property
    def where(self) -> str:
        return f"{self.module or '(top level)'} · {self.op} · {self.phase} · step {self.step} · rank {self.rank}"

    @property
    def verdict_text(self) -> str:
        return VERDICT_TEXT.get(self.verdict, self.verdict)

    def to_dict(self) -> dict[str, Any]:
        return json_safe(asdict(self))
