"""The files of a MindSpore Data Dump iteration folder: tensor file names, .npy and statistic.csv.

A tensor file is named (MindSpore 2.x, e2e dump)::

    {OpType}.{op name}.{task}.{stream}.{timestamp}.{input|output}.{slot}.{format}.{Dtype}.npy

where the op name is the op's full scoped name with ``/`` turned into ``_`` (so
``_backbone`` reads ``__backbone``: the mangling cannot be undone; names are matched against
the execution-order CSV instead, :func:`mangle`). A ``statistic`` dump writes, in the same
folder, ``statistic.csv``: one row per tensor with the columns ``Op Type, Op Name, Task ID,
Stream ID, Timestamp, IO, Slot, Data Size, Data Type, Shape`` and then the statistics the
dump config's ``statistic_category`` chose, among ``Max Value, Min Value, Avg Value, Count,
Negative Zero Count, Positive Zero Count, NaN Count, Negative Inf Count, Positive Inf Count,
Zero Count, L2Norm Value, MD5, SHA1`` (MindSpore's dump documentation).
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from opscope.errors import DumpFormatError

_FIELDS_AFTER_NAME = 8  # task, stream, timestamp, io, slot, format, dtype, "npy"
_MANGLED = re.compile(r"[/\\. ]")


@dataclass(frozen=True)
class TensorFile:
    """One ``.npy`` of an iteration folder, as its name describes it."""

    file: str
    op_type: str
    op_name: str  # mangled full scoped name
    timestamp: int
    io: str
    slot: int
    dtype: str  # torch-style: float32, bfloat16, bool...
    layout: str = "DefaultFormat"  # the device format the data is stored in


# Formats whose data is in the tensor's own (row-major) order; others (NC1HWC0, FRACTAL_NZ...)
# are Ascend device layouts, written so when the dump config's trans_flag is false.
HOST_FORMATS = frozenset({"DefaultFormat", "ND", "NCHW", "NHWC", "NCDHW", "NDHWC", "HWCN", "NC", "NCL"})


def mangle(full_name: str) -> str:
    """The op name as a dump file name carries it (and as matching compares it)."""
    return _MANGLED.sub("_", full_name)


def dtype_name(ms_dtype: str) -> str:
    """MindSpore's ``Float32`` / ``BFloat16`` / ``Bool`` (or ``float32``) -> ``float32`` ..."""
    return ms_dtype.strip().lower()


def parse_name(name: str) -> TensorFile | None:
    """The fields of a tensor file name, or None when the name is not one (``statistic.csv``)."""
    parts = name.split(".")
    if len(parts) < _FIELDS_AFTER_NAME + 2 or parts[-1] != "npy" or parts[-5] not in ("input", "output"):
        return None
    task, stream, stamp, io, slot, layout, dtype = parts[-8:-1]
    if not (slot.isdigit() and stamp.isdigit()):
        return None
    head = parts[:-_FIELDS_AFTER_NAME]
    op_type, op_name = head[0], mangle(".".join(head[1:]))
    return TensorFile(name, op_type, op_name, int(stamp), io, int(slot), dtype_name(dtype), layout)


def load_array(path: Path) -> np.ndarray:
    """A dumped tensor, read without unpickling; a clear DumpFormatError when it cannot be."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            header = read_header(f)
    except (OSError, ValueError, EOFError) as exc:
        raise DumpFormatError(f"{path.name}: not a readable .npy file ({exc}); the dump may be "
                              "truncated: dump again, or delete the file to compare without it") from None
    if header[2].hasobject:
        raise DumpFormatError(f"{path.name}: holds Python objects (dtype {header[2]}), which only "
                              "unpickling could read; refused (MindSpore writes plain numeric arrays: "
                              "this file did not come from its dump)")
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise DumpFormatError(f"{path.name}: truncated or corrupt .npy ({exc}); dump again, or delete "
                              "the file to compare without it") from None


# statistic.csv column -> opscope statistic
_STAT_COLUMNS = {"Max Value": "max", "Min Value": "min", "Avg Value": "mean", "L2Norm Value": "norm",
                 "NaN Count": "nan", "Zero Count": "zeros"}
_INF_COLUMNS = ("Negative Inf Count", "Positive Inf Count")
# content digests a statistic dump may hold ("hash:md5" / "hash:sha1" in statistic_category):
# their first 64 bits are kept as the record's hash (equal content, equal hash)
DIGEST_COLUMNS = ("MD5", "SHA1")
STATISTIC_CSV = "statistic.csv"
REQUIRED_COLUMNS = ("Op Type", "Op Name", "IO", "Slot", "Data Type", "Shape")


@dataclass(frozen=True)
class StatisticRow:
    """One row of ``statistic.csv``."""

    op_type: str
    op_name: str  # mangled, as in file names
    timestamp: int
    io: str
    slot: int
    dtype: str
    shape: list[int]
    stats: dict[str, Any]


def read_statistics(path: Path) -> list[StatisticRow]:
    """Every row of a ``statistic.csv``; DumpFormatError naming what is missing or malformed."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = [h.strip() for h in next(reader, [])]
            rows = [r for r in reader if any(c.strip() for c in r)]
    except (OSError, UnicodeDecodeError) as exc:
        raise DumpFormatError(f"{path}: unreadable ({exc})") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise DumpFormatError(f"{path}: not a MindSpore statistic.csv (no column {', '.join(missing)}; "
                              f"its header is {','.join(header)!r})")
    at = {name: i for i, name in enumerate(header)}
    out = []
    for n, row in enumerate(rows, start=2):
        try:
            out.append(_statistic_row(row, at))
        except (IndexError, ValueError) as exc:
            raise DumpFormatError(f"{path}, line {n}: malformed ({exc}); expected the columns "
                                  f"{','.join(header)}") from None
    return out


def _statistic_row(row: list[str], at: dict[str, int]) -> StatisticRow:
    def cell(name: str) -> str:
        return row[at[name]].strip() if name in at and at[name] < len(row) else ""

    stats: dict[str, Any] = {}
    for column, stat in _STAT_COLUMNS.items():
        if cell(column):
            stats[stat] = int(float(cell(column))) if stat in ("nan", "zeros") else float(cell(column))
    if any(cell(c) for c in _INF_COLUMNS):
        stats["inf"] = sum(int(float(cell(c) or 0)) for c in _INF_COLUMNS)
    if "max" in stats and "min" in stats:
        stats["absmax"] = max(abs(stats["max"]), abs(stats["min"]))
    for column in DIGEST_COLUMNS:
        if re.fullmatch(r"[0-9a-fA-F]{16,}", cell(column)):
            stats["hash"] = int(cell(column)[:16], 16)
            break
    shape = [int(x) for x in re.findall(r"-?\d+", cell("Shape"))]
    stamp = cell("Timestamp")
    return StatisticRow(cell("Op Type"), mangle(cell("Op Name")), int(stamp) if stamp.isdigit() else 0,
                        cell("IO").lower(), int(cell("Slot")), dtype_name(cell("Data Type")), shape, stats)


def digest_column(path: Path) -> str | None:
    """The digest column (``MD5``, ``SHA1``) a ``statistic.csv`` has, if any."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            header = [h.strip() for h in next(csv.reader(f), [])]
    except (OSError, UnicodeDecodeError):
        return None
    return next((c for c in DIGEST_COLUMNS if c in header), None)


def numel(shape: list[int]) -> int:
    return math.prod(shape) if shape else 1
