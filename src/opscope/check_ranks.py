"""Check that data-parallel ranks kept identical what they must keep identical.

In data-parallel training (DDP and the like) every rank holds the same parameters, and
after the gradient all-reduce the same gradients, so every rank applies the same update.
A dump of such a run records, under ``<Optimizer>.step`` in the ``optimizer`` phase, each
parameter before the update (``io=param``), its gradient at ``optimizer.step()``
(``io=grad``, after the all-reduce) and its value after the update (``io=output``).
:func:`check_ranks` lines these up across ranks and finds where they first differ:
content hashes first (bit-exact), then the distance from the full tensors when the dump
kept them, else a lower bound from the norms.

Pure analysis on the dump files: no torch.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any

IO_MEANING = {
    "param": "parameter before the update",
    "grad": "gradient at optimizer.step, after the all-reduce",
    "output": "parameter after the update",
}
IO_ORDER = {"param": 0, "grad": 1, "output": 2}
COLUMNS = ["rank", "step", "seq", "phase", "op", "call", "io", "param", "dtype", "shape",
           "min", "max", "mean", "norm", "nan", "inf", "hash", "data", "key", "view"]
TENSOR_DISTANCES = 20  # differences whose distance is measured on full tensors (when dumped)


@dataclass(frozen=True)
class RankDifference:
    """One tensor that is not the same on every rank.

    ``ranks`` differ from ``reference`` (the largest group of ranks that agree with each
    other; on a tie, the group with the lowest rank). ``missing`` ranks did not record it.
    """

    step: int
    op: str
    param: str
    io: str
    ranks: tuple[int, ...]
    reference: tuple[int, ...]
    missing: tuple[int, ...] = ()
    norms: dict[int, float | None] = field(default_factory=dict)
    max_abs_diff: float | None = None
    rel_l2: float | None = None
    rel_l2_lower_bound: float | None = None
    note: str = ""

    @property
    def what(self) -> str:
        """The tensor in words: ``gradient at optimizer.step, after the all-reduce``."""
        return IO_MEANING.get(self.io, self.io)

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step, "op": self.op, "param": self.param, "io": self.io, "what": self.what,
            "ranks": list(self.ranks), "reference": list(self.reference), "missing": list(self.missing),
            "norms": {str(k): v for k, v in self.norms.items()}, "max_abs_diff": self.max_abs_diff,
            "rel_l2": self.rel_l2, "rel_l2_lower_bound": self.rel_l2_lower_bound, "note": self.note,
        }


@dataclass
class RankCheck:
    """The outcome of :func:`check_ranks`; truthy when every rank agrees.

    ``status`` is ``identical``, ``differs`` or ``cannot_check`` (then ``reason`` says why).
    ``differences`` are in execution order: step, then optimizer order, so the first is
    where the ranks start to disagree.
    """

    path: str
    status: str
    ranks: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    params: int = 0
    checked: int = 0
    differences: list[RankDifference] = field(default_factory=list)
    reason: str | None = None
    warnings: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.status == "identical"

    @property
    def first(self) -> RankDifference | None:
        """Where the ranks first differ (None when they agree)."""
        return self.differences[0] if self.differences else None

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path, "status": self.status, "ranks": self.ranks, "steps": self.steps,
            "params": self.params, "checked": self.checked, "reason": self.reason, "warnings": self.warnings,
            "first": None if self.first is None else self.first.to_json(),
            "differences": [d.to_json() for d in self.differences],
        }


def check_ranks(path: str | os.PathLike, steps: list[int] | None = None) -> RankCheck:
    """Compare parameters and gradients at ``optimizer.step()`` across the ranks of a dump.

    Args:
        path: a dump written by every rank (or at least two) of a data-parallel run.
        steps: only these steps (all steps present when None).

    Returns:
        A :class:`RankCheck`; ``status == "cannot_check"`` when fewer than two ranks
        recorded a common step with optimizer records.

    Raises:
        DumpFormatError: no readable dump at ``path``.
    """
    from opscope.storage.reader import load

    dump = load(path)
    try:
        return _check(dump, steps)
    finally:
        dump.close()


def _check(dump: Any, only_steps: list[int] | None) -> RankCheck:
    check = RankCheck(str(dump.path), "cannot_check", ranks=list(dump.ranks), warnings=list(dump.problems))
    if len(check.ranks) < 2:
        wrote = f"only rank {check.ranks[0]} wrote" if check.ranks else "no rank wrote"
        check.reason = (f"{wrote} this dump; check-ranks needs at least two ranks of the same run. "
                        "Dump every rank (leave \"ranks\" out of the dump config) or list two or more")
        return check
    frame = _optimizer_rows(dump, only_steps)
    if frame.empty:
        check.reason = ("the dump has no optimizer records (<Optimizer>.step param/grad/output); dump training "
                        "steps with the \"optimizer\" phase, without ops/scope filters that leave it out")
        return check
    per_rank = {int(r): {int(s) for s in steps} for r, steps in frame.groupby("rank")["step"].unique().items()}
    common = sorted({s for steps in per_rank.values() for s in steps
                     if sum(s in other for other in per_rank.values()) >= 2})
    for rank, steps in per_rank.items():
        missed = sorted(set(common) - steps)
        if missed:
            check.warnings.append(f"rank {rank} has no optimizer records for steps {missed}")
    lonely = sorted(set(check.ranks) - set(per_rank))
    if lonely:
        check.warnings.append(f"ranks {lonely} have no optimizer records")
    if not common:
        check.reason = "no step has optimizer records from two ranks: the ranks dumped different steps"
        return check
    frame = frame[frame.step.isin(common)]
    check.steps = common
    check.params = int(frame.drop_duplicates(["op", "call", "name"]).shape[0])
    check.differences, check.checked = _compare(dump, frame, per_rank)
    check.status = "differs" if check.differences else "identical"
    return check


def _optimizer_rows(dump: Any, only_steps: list[int] | None) -> Any:
    import pandas as pd
    import pyarrow.compute as pc

    tables = []
    for rank, step in dump.partitions():
        if only_steps is not None and step not in only_steps:
            continue
        table = dump.records(rank=rank, step=step, columns=COLUMNS)
        mask = pc.and_(pc.equal(table["phase"], "optimizer"), pc.is_in(table["io"], _strings(list(IO_ORDER))))
        table = table.filter(mask)
        # uint64 with nulls would become float64 in pandas, losing the low bits of the hash.
        table = table.set_column(table.schema.get_field_index("hash"), "hash", pc.cast(table["hash"], "string"))
        tables.append(table.to_pandas())
    tables = [t for t in tables if not t.empty]
    if not tables:
        return pd.DataFrame(columns=COLUMNS)
    frame = pd.concat(tables, ignore_index=True)
    frame = frame[frame.op.str.endswith(".step")].copy()
    # grad rows may carry no name: take it from the param/output rows of the same call.
    named = frame.param.where(frame.param.astype(bool) & frame.param.notna())
    named = named.groupby([frame["rank"], frame.step, frame.op, frame.call]).transform("first")
    frame["name"] = [p if isinstance(p, str) else f"{o}#{c}" for p, o, c in zip(named, frame.op, frame.call)]
    frame = frame.sort_values(["rank", "step", "seq"], kind="stable")
    # An optimizer stepped twice in one step (gradient accumulation mistakes, GANs): keep both.
    frame["occurrence"] = frame.groupby(["rank", "step", "op", "call", "io"]).cumcount()
    frame["shape"] = [tuple(s) if s is not None else () for s in frame["shape"]]
    return frame.reset_index(drop=True)


def _strings(values: list[str]) -> Any:
    import pyarrow as pa

    return pa.array(values, type=pa.string())


KEY = ["step", "op", "call", "io", "occurrence"]


def _compare(dump: Any, frame: Any, per_rank: dict[int, set[int]]) -> tuple[list[RankDifference], int]:
    found: list[tuple[tuple, RankDifference, Any, Any]] = []
    ranks_of_step = {s: sorted(r for r, steps in per_rank.items() if s in steps) for s in frame.step.unique()}
    settled, checked = _settled(frame, ranks_of_step)
    for key, group in frame[~settled].groupby(KEY, sort=False):
        expected, present = ranks_of_step[key[0]], [int(r) for r in group["rank"]]
        if len(present) < 2 and len(expected) < 2:
            continue
        checked += 1
        groups = _agreeing_groups(group)
        missing = tuple(sorted(set(expected) - set(present)))
        if len(groups) == 1 and not missing:
            continue
        reference, others = groups[0], tuple(sorted(r for g in groups[1:] for r in g))
        a = group[group["rank"] == reference[0]].iloc[0]
        b = group[group["rank"] == others[0]].iloc[0] if others else None
        diff = RankDifference(
            step=int(a.step), op=str(a.op), param=str(a["name"]), io=str(a.io), ranks=others, reference=reference,
            missing=missing, norms={int(r): _float(n) for r, n in zip(group["rank"], group["norm"])},
            note=f"not recorded on rank(s) {list(missing)}" if missing else "")
        if b is not None:
            diff = dataclasses.replace(diff, **_stats_distance(a, b))
        found.append(((int(a.step), int(a.seq), IO_ORDER[a.io]), diff, a, b))
    found.sort(key=lambda item: item[0])
    differences = []
    for i, (_, diff, a, b) in enumerate(found):
        if i < TENSOR_DISTANCES and b is not None and _has_tensor(a) and _has_tensor(b) and a.shape == b.shape:
            diff = dataclasses.replace(diff, **_tensor_distance(dump, a, b))
        differences.append(diff)
    return differences, checked


def _settled(frame: Any, ranks_of_step: dict[int, list[int]]) -> tuple[Any, int]:
    """Rows whose tensor has one hash on every rank that recorded its step (vectorised fast
    path), and how many such tensors were seen on two ranks or more."""
    by_key = [frame[k] for k in KEY]
    content = frame.hash.fillna("?") + "|" + frame.dtype.astype(str) + "|" + frame["shape"].astype(str)
    size = frame["rank"].groupby(by_key, sort=False).transform("size")
    agree = (content.groupby(by_key, sort=False).transform("nunique") == 1) & frame.hash.notna()
    settled = agree & (size == frame.step.map(lambda s: len(ranks_of_step[s])))
    return settled, int(frame[settled & (size >= 2)].drop_duplicates(KEY).shape[0])


def _agreeing_groups(group: Any) -> list[tuple[int, ...]]:
    """Ranks grouped by identical content, largest group first (ties: lowest rank first)."""
    by_content: dict[Any, list[int]] = {}
    for row in group.itertuples(index=False):
        if isinstance(row.hash, str):
            content = ("hash", row.hash, row.dtype, row.shape)
        else:  # no hash (a meta tensor): statistics are all there is
            content = ("stats", row.dtype, row.shape,
                       *(_float(getattr(row, c)) for c in ("min", "max", "mean", "norm")))
        by_content.setdefault(content, []).append(int(row.rank))
    groups = [tuple(sorted(ranks)) for ranks in by_content.values()]
    return sorted(groups, key=lambda g: (-len(g), g[0]))


def _stats_distance(a: Any, b: Any) -> dict[str, Any]:
    """What the statistics say: |norm(a) - norm(b)| / max norm bounds the relative L2 distance from below."""
    values: dict[str, Any] = {}
    na, nb = _float(a.norm), _float(b.norm)
    if na is not None and nb is not None and max(na, nb) > 0:
        values["rel_l2_lower_bound"] = abs(na - nb) / max(na, nb)
    if a.shape != b.shape or a.dtype != b.dtype:
        values["note"] = (f"{a.dtype}{list(a.shape)} on rank {int(a['rank'])}, {b.dtype}{list(b.shape)} on "
                          f"rank {int(b['rank'])}: not data-parallel copies (sharded or different models?)")
    return values


def _tensor_distance(dump: Any, a: Any, b: Any) -> dict[str, Any]:
    """The distance of rank b's tensor from rank a's, read block by block by compare's engine
    (:class:`opscope.compare.stream.PairStream`: memory stays the same whatever the tensor's size)."""
    from opscope.compare.stream import PairStream
    from opscope.errors import DumpFormatError

    stream = PairStream(dump, dump)
    try:
        s = stream.pair(_side(b), _side(a), rel_floor=1e-300, rtol=math.inf)
    except (DumpFormatError, OSError, ValueError):  # an unreadable shard: the norms still tell something
        return {}
    finally:
        stream.close()
    return {"max_abs_diff": s.max_abs, "rel_l2": s.diff_norm / s.ref_norm if s.ref_norm > 0 else s.diff_norm}


def _side(row: Any) -> tuple[int, int, str, str, str | None]:
    view = row.get("view")
    return int(row["rank"]), int(row.step), str(row.data), str(row.key), view if isinstance(view, str) else None


def _has_tensor(row: Any) -> bool:
    return isinstance(row.get("data"), str) and bool(row.get("data")) and isinstance(row.get("key"), str)


def _float(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


def explain(diff: RankDifference) -> str:
    """What the first difference most likely means, in one sentence."""
    if diff.missing and not diff.ranks:
        return ("a rank did not record this tensor: the parameter had no gradient there (unused on that "
                "rank?) or the ranks ran different code")
    if diff.io == "grad":
        return ("the gradients differ after the all-reduce: a rank changed its gradient after backward "
                "(clipping or scaling on one rank, a hook), skipped the all-reduce (no_sync), or the "
                "all-reduce itself went wrong")
    if diff.io == "param":
        return ("the parameters already differed before this update: they were not broadcast at the start "
                "(DDP does it at construction) or a rank changed them outside the optimizer")
    return ("the update differs with the same parameters and gradients: the optimizer's state or settings "
            "differ between ranks, or its update is not deterministic")
