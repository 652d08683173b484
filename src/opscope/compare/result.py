"""Result objects of a comparison: plain data that never prints (reporters show it)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa

from opscope.compare.pairs_file import PairsFile

VERDICTS = ("identical", "within_tolerance", "diverged")
COUNT_KEYS = ("pairs", "identical", "passed", "failed", "skipped", "unpaired_target", "unpaired_reference")
SUMMARY_METRICS = ("error", "tolerance", "input_error", "ratio", "rel_l2", "cosine", "max_abs",
                   "mean_abs", "max_rel", "mean_rel", "rmse", "snr_db", "out_of_tolerance",
                   "nan_mismatch", "inf_mismatch")


@dataclass
class Finding:
    """An operator (or a parameter / model input, for ``kind == "root"``) blamed for a divergence.

    ``io`` and ``slot`` name its worst output; ``metrics`` are that output's; ``inputs`` and
    ``outputs`` list each tensor of the call with its error and status; ``upstream`` and
    ``downstream`` are the calls that produced its inputs and consumed its outputs.
    """

    kind: str
    rank: int
    step: int
    phase: str
    module: str
    op: str
    call: int | None
    io: str
    slot: int | None
    seq: int
    metrics: dict[str, Any]
    score: float = 0.0
    side: str = "both"
    param: str | None = None
    source: str | None = None
    dtype: str = ""
    inputs: list[dict[str, Any]] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    upstream: list[dict[str, Any]] = field(default_factory=list)
    downstream: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""
    id: str = ""  # "rank:step:seq" of its call ("r" before a reference-side seq); opscope replay --op ID
    calls: dict[str, Any] = field(default_factory=dict)  # per side: {"seq", "capture": [[phase, module, op, call]]}
    replay: dict[str, Any] | None = None  # opscope.replay.ReplayResult.to_dict(), when replayed

    @property
    def where(self) -> str:
        """One line naming it: module path, op, phase, step and rank."""
        module = self.module or "(top level)"
        what = f"parameter {self.param}" if self.kind == "root" and self.param else self.op
        return f"{module} · {what} · {self.phase} · step {self.step} · rank {self.rank}"

    def to_dict(self) -> dict[str, Any]:
        return json_safe(asdict(self))


@dataclass
class CompareResult:
    """What :func:`opscope.compare` found.

    Attributes:
        verdict: "identical", "within_tolerance" or "diverged".
        first_divergence: the first culprit in execution order (forward, backward,
            optimizer), or None.
        first_divergence_by_rank: the same per rank (rank and step of each rank's earliest
            divergence; ranks that did not diverge are absent).
        culprits: every culprit and root, ranked (earliest step first, then most out of
            proportion first).
        counts: pairs, identical, passed, failed, skipped, unpaired_target, unpaired_reference.
        problems: what could not be compared and why, one sentence each.
        notes: how values were read before they were compared, one sentence each (a
            side's loss scale, divided out).
        statistics_only: True when some pairs were judged from statistics alone (weaker).
        pairs_table: one row per aligned tensor pair (and per unpaired record), as Arrow
            (read back from ``pairs_file`` when it went to disk: a large comparison's table
            is never held whole unless asked for here).
        pairs_file: where the pairs table is (:class:`~opscope.compare.pairs_file.PairsFile`:
            its row count, ranks, steps, the rows a slice at a time, a bounded preview).
    """

    target: str
    reference: str
    verdict: str
    first_divergence: Finding | None
    culprits: list[Finding]
    counts: dict[str, int]
    pairs_file: PairsFile
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    first_divergence_by_rank: dict[int, Finding] = field(default_factory=dict)
    statistics_only: bool = False
    weaker: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0
    bytes_compared: int = 0

    def __bool__(self) -> bool:
        """True when nothing diverged (Polygraphy-style: a result is truthy when it passed)."""
        return self.verdict != "diverged"

    @property
    def pairs_table(self) -> pa.Table:
        """Every pair, one row each (the whole table in memory: for a large comparison,
        ``pairs_file.batches()`` reads it a slice at a time)."""
        return self.pairs_file.table()

    @property
    def ranks(self) -> list[int]:
        """The ranks compared (rank N of the target against rank N of the reference)."""
        return sorted(self.pairs_file.ranks)

    @property
    def steps(self) -> list[int]:
        """The steps compared."""
        return sorted(self.pairs_file.steps)

    @property
    def pairs(self) -> Any:
        """The pairs as a pandas DataFrame (pandas installed), else the Arrow table."""
        try:
            import pandas  # noqa: F401
        except ImportError:
            return self.pairs_table
        return self.pairs_table.to_pandas()

    def to_summary(self) -> dict[str, Any]:
        """The ``summary.json`` document (docs/compare.md has the schema)."""
        return json_safe({
            "schema": "opscope.compare.summary/1",
            "target": self.target,
            "reference": self.reference,
            "verdict": self.verdict,
            "first_divergence": self.first_divergence.to_dict() if self.first_divergence else None,
            "first_divergence_by_rank": {str(k): v.to_dict() for k, v in self.first_divergence_by_rank.items()},
            "ranks": self.ranks,
            "steps": self.steps,
            "culprits": [c.to_dict() for c in self.culprits],
            "counts": dict(self.counts),
            "statistics_only": self.statistics_only,
            "weaker": self.weaker,
            "problems": list(self.problems),
            "notes": list(self.notes),
            "settings": dict(self.settings),
            "elapsed_s": round(self.elapsed_s, 3),
            "bytes_compared": self.bytes_compared,
        })

    def to_json(self) -> str:
        return json.dumps(self.to_summary(), indent=1, allow_nan=False)


def spans(values: list[int]) -> str:
    """``0-3, 8`` for 0, 1, 2, 3, 8 (sorted values): runs of consecutive numbers."""
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][-1] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def json_safe(value: Any) -> Any:
    """JSON-safe copy: non-finite floats become strings ("inf", "-inf", "nan")."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return json_safe(value.item())
    return value
