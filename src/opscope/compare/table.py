"""The pairs table: one row per aligned tensor pair (and per unpaired record), as Arrow."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa

from opscope.compare.align import Pair
from opscope.compare.metrics import METRICS

# (column, Arrow type, how to get it from a Pair)
_STR, _INT, _F64, _BOOL = pa.string(), pa.int64(), pa.float64(), pa.bool_()


def _side(pair: Pair, side: str, col: str) -> Any:
    row = pair.t if side == "t" else pair.r
    return None if row is None else row.get(col)


def _name(pair: Pair, col: str) -> Any:
    home = pair.home
    return home.get(f"orig_{col}", home.get(col))


COLUMNS: list[tuple[str, pa.DataType, Any]] = [
    ("order", _INT, None),
    ("rank", _INT, lambda p: p.home.get("rank")),
    ("step", _INT, lambda p: p.home.get("step")),
    ("phase", _STR, lambda p: p.home.get("phase")),
    ("module", _STR, lambda p: _name(p, "module")),
    ("op", _STR, lambda p: _name(p, "op")),
    ("call", _INT, lambda p: p.home.get("call")),
    ("io", _STR, lambda p: p.home.get("io")),
    ("slot", _INT, lambda p: p.home.get("slot")),
    ("arg", _STR, lambda p: p.home.get("arg")),
    ("param", _STR, lambda p: _name(p, "param")),
    ("kind", _STR, lambda p: p.kind),
    ("side", _STR, lambda p: p.side or ("both" if p.t is not None and p.r is not None else "")),
    ("status", _STR, lambda p: p.status),
    ("verdict", _STR, lambda p: p.verdict),
    ("mode", _STR, lambda p: p.mode),
    ("error", _F64, lambda p: p.error),
    ("tolerance", _F64, lambda p: p.tolerance),
    ("input_error", _F64, lambda p: p.metrics.get("input_error")),
    ("ratio", _F64, lambda p: p.metrics.get("ratio")),
    ("bit_exact", _BOOL, lambda p: p.metrics.get("bit_exact")),
    ("seq_target", _INT, lambda p: _side(p, "t", "seq")),
    ("seq_reference", _INT, lambda p: _side(p, "r", "seq")),
    ("id_target", _INT, lambda p: _side(p, "t", "id")),
    ("id_reference", _INT, lambda p: _side(p, "r", "id")),
    ("producer_target", _INT, lambda p: _side(p, "t", "producer")),
    ("producer_reference", _INT, lambda p: _side(p, "r", "producer")),
    ("op_reference", _STR, lambda p: _side(p, "r", "op")),
    ("module_reference", _STR, lambda p: _side(p, "r", "module")),
    ("dtype_target", _STR, lambda p: _side(p, "t", "dtype")),
    ("dtype_reference", _STR, lambda p: _side(p, "r", "dtype")),
    ("shape_target", _STR, lambda p: _shape(_side(p, "t", "shape"))),
    ("shape_reference", _STR, lambda p: _shape(_side(p, "r", "shape"))),
    ("numel", _INT, lambda p: p.home.get("numel")),
    ("source", _STR, lambda p: p.home.get("source")),
    ("note", _STR, lambda p: p.note or None),
]


def _shape(shape: Any) -> str | None:
    return None if shape is None else "[" + ", ".join(str(int(x)) for x in shape) + "]"


def _float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def pairs_table(pairs: list[Pair], start: int = 0) -> pa.Table:
    """Build the table; metric columns follow the metric registry. ``start``: the ``order``
    of the first pair (a partition's slice continues the previous one's)."""
    arrays: dict[str, pa.Array] = {}
    for name, kind, get in COLUMNS:
        if get is None:
            values: list[Any] = list(range(start, start + len(pairs)))
        elif kind == _F64:
            values = [_float(get(p)) for p in pairs]
            values = [None if v is not None and math.isnan(v) else v for v in values]
        else:
            values = [get(p) for p in pairs]
        arrays[name] = _array(values, kind)
    for name in METRICS:
        values = [_float(p.metrics.get(name)) if p.metrics else None for p in pairs]
        arrays[name] = _array([None if v is not None and math.isnan(v) else v for v in values], _F64)
    return pa.Table.from_arrays(list(arrays.values()), names=list(arrays))


def _array(values: list[Any], kind: pa.DataType) -> pa.Array:
    """An Arrow column from Python values (None: null), built from its buffers: ``pa.array``
    imports pandas (~0.3 s, most of a small compare) to ask whether its input is a pandas object."""
    n = len(values)
    valid = np.fromiter((v is not None for v in values), dtype=bool, count=n)
    nulls = n - int(np.count_nonzero(valid))
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    if kind == _STR:
        encoded = [b"" if v is None else str(v).encode() for v in values]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=n), out=offsets[1:])
        if offsets[-1] >= 1 << 31:  # beyond 32-bit offsets: Arrow's converter makes the chunks
            return pa.array(values, type=kind)
        return pa.Array.from_buffers(kind, n, [bitmap, pa.py_buffer(offsets.astype(np.int32)),
                                               pa.py_buffer(b"".join(encoded))], null_count=nulls)
    if kind == _BOOL:
        bits = np.fromiter((bool(v) for v in values), dtype=bool, count=n)
        return pa.Array.from_buffers(kind, n, [bitmap, pa.py_buffer(np.packbits(bits, bitorder="little"))],
                                     null_count=nulls)
    data = np.fromiter((0 if v is None else v for v in values), dtype=np.float64 if kind == _F64 else np.int64, count=n)
    return pa.Array.from_buffers(kind, n, [bitmap, pa.py_buffer(data)], null_count=nulls)
