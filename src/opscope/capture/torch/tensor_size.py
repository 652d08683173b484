"""How many bytes the full tensors of a dump step take, counted from index rows (a size
probe's, an earlier dump's, a first pass's): used before a tensor dump starts
(:mod:`~opscope.capture.torch.suspects`) and by ``opscope show``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from opscope.config import DumpConfig
from opscope.model.records import COL, COLUMNS

_PRODUCER, _NOTE, _NUMEL, _DTYPE = COL["producer"], COL["note"], COL["numel"], COL["dtype"]
_OP, _MODULE, _PHASE, _CALL = COL["op"], COL["module"], COL["phase"], COL["call"]
_VIEW, _ID = COL["view"], COL["id"]
ITEMSIZE = {"float64": 8, "int64": 8, "complex64": 8, "complex128": 16, "uint64": 8, "float32": 4, "int32": 4,
            "uint32": 4, "float16": 2, "bfloat16": 2, "int16": 2, "uint16": 2, "int8": 1, "uint8": 1, "bool": 1,
            "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1}
Wants = Callable[[str, str, str, int], bool]  # (op, module, phase, call) -> full tensors?
_TRANSPOSING = frozenset("t transpose transpose_ permute swapaxes swapdims movedim moveaxis mT mH T H adjoint".split())
_EVERY_OP = DumpConfig().to_json()  # ops and phases of a dump that records every op


class Source(NamedTuple):
    """The records ``estimate_from`` names: one step of this rank, rows in COLUMNS order."""

    path: str
    step: int
    rows: list[list[Any]]
    views_known: bool  # the rows say which views share their input's data (a data="tensor" dump)
    differs: str  # "" or the keys (level, mode, scope, ops, phases) that make the figure approximate


def tensor_bytes(rows: Sequence[Sequence[Any]], wants: Wants, place_views: bool, views_known: bool = True,
                 selected: Callable[[str, str, str], bool] | None = None) -> tuple[int, int]:
    """Bytes and count of the full tensors a tensor step stores, from one step's rows (COLUMNS
    order; a size probe's or any dump's): rows measured (no producer, no note) and views not
    kept as their input's data own it. ``place_views``: views are kept so (data="tensor"; not
    with tensor_ops or suspects). ``views_known``: the ``view`` column says which were (a
    probe, a data="tensor" dump), else :func:`_placeable_views` judges. ``selected`` (module,
    op, phase): rows of a wider dump, as this dump's filters record them (:func:`_as_selected`).
    """
    placeable = set() if views_known or not place_views else _placeable_views(rows)
    if selected is not None:
        rows = _as_selected(rows, selected)
    nbytes = count = 0
    for row in rows:
        note = row[_NOTE]
        if note == "view":
            own = not (place_views and (row[_VIEW] is not None or row[_ID] in placeable))
        else:
            own = row[_PRODUCER] is None and note is None
        if own and wants(row[_OP], row[_MODULE], row[_PHASE], row[_CALL]):
            nbytes += int(row[_NUMEL] or 0) * ITEMSIZE.get(row[_DTYPE], 4)
            count += 1
    return nbytes, count


def _as_selected(rows: Sequence[Sequence[Any]], selected: Callable[[str, str, str], bool]) -> list[Sequence[Any]]:
    """The rows a dump filtered by ``selected`` records of the same step: other calls' rows
    dropped; of the rows that linked to a dropped record, the first measures the tensor (owns
    it) and later ones link to that one."""
    kept_ids = {row[_ID] for row in rows if selected(row[_MODULE], row[_OP], row[_PHASE])}
    owner: dict[Any, Any] = {}
    kept: list[Sequence[Any]] = []
    for row in sorted((r for r in rows if r[_ID] in kept_ids), key=lambda r: r[_ID]):
        producer = row[_PRODUCER]
        if producer is not None and producer not in kept_ids:
            row = list(row)
            if producer in owner:
                row[_PRODUCER], row[_NOTE] = owner[producer], None
            else:
                owner[producer] = row[_ID]
                row[_PRODUCER] = row[_NOTE] = row[_VIEW] = None
        kept.append(row)
    return kept


def _placeable_views(rows: Sequence[Sequence[Any]]) -> set[int]:
    """Without recorded geometry (a statistics dump), the ids of the view rows a data="tensor"
    dump keeps as their input's data: their input has their dtype and is contiguous. A
    statistics dump records no strides, so an input is taken as non-contiguous when it is (a
    view of) a view that transposes (t, transpose, permute...), else as contiguous."""
    by_id = {row[_ID]: row for row in rows}
    out: set[int] = set()
    for row in rows:
        src = by_id.get(row[_PRODUCER]) if row[_NOTE] == "view" else None
        if src is not None and src[_DTYPE] == row[_DTYPE] and not _transposed(src, by_id):
            out.add(row[_ID])
    return out


def _transposed(src: Sequence[Any], by_id: dict[Any, Sequence[Any]]) -> bool:
    """Whether the tensor of row ``src`` is (a view of) a transposing view: an odd number of
    2-d ``t`` (which undo each other) or any other transpose or permute."""
    made, flips = by_id.get(src[_PRODUCER]), 0  # the record of the same elements
    for _ in range(64):
        if made is None or made[_NOTE] != "view":
            break
        parts = str(made[_OP]).split(".")
        if sum(1 for n in made[COL["shape"]] or () if n > 1) >= 2 and any(p in _TRANSPOSING for p in parts):
            if "t" not in parts:
                return True
            flips += 1
        made = by_id.get(made[_PRODUCER])  # that view's input row, then what made it
        made = None if made is None else by_id.get(made[_PRODUCER])
    return flips % 2 == 1


def differs(config: dict[str, Any], cfg: DumpConfig) -> str:
    """What makes an estimate from a dump of ``config`` approximate for ``cfg``: another level,
    mode or scope records other calls and links (scope: backward attribution); ops and phases
    are applied to a dump that recorded every op (:func:`_as_selected`)."""
    mine = cfg.to_json()
    keys = [k for k in ("level", "mode", "scope", "ops", "phases")
            if config.get(k) != mine[k] and (k in ("level", "mode", "scope") or config.get(k) != _EVERY_OP[k])]
    return f"; that dump has another {', '.join(keys)}: approximate" if keys else ""


def table_rows(table: Any) -> list[list[Any]]:
    """An Arrow table of index rows as lists in COLUMNS order (absent columns None)."""
    cols = [table.column(c).to_pylist() if c in table.column_names else None for c in COLUMNS]
    return [[None if col is None else col[i] for col in cols] for i in range(table.num_rows)]


def places_views(manifest: dict[str, Any]) -> bool:
    """Whether a dump recorded which views share their input's data (its ``view`` column): a
    data="tensor" dump of every op that no tensor_limit_mb stopped."""
    config = manifest.get("config") or {}
    tensor_ops = config.get("tensor_ops") or {}
    some_ops = any(tensor_ops.values()) if isinstance(tensor_ops, dict) else bool(tensor_ops)
    stopped = (manifest.get("tensor_capture") or {}).get("stopped")
    return config.get("data") == "tensor" and not config.get("suspects") and not some_ops and not stopped


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"
