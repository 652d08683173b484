"""Conversion of capture rows (lists in COLUMNS order) to Arrow tables in SCHEMA order."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from opscope.model.records import COL, STAT_NAMES, STATS
from opscope.storage.format import SCHEMA

_STAT_INDEX = {name: i for i, name in enumerate(STAT_NAMES)}
_HASH = _STAT_INDEX["hash"]


def _encode_args(values: Sequence[Any]) -> list[str | None]:
    """JSON text of each call's non-tensor arguments (rows of one call share one object)."""
    done: dict[int, str | None] = {}
    out = []
    for v in values:
        if v is None or v.__class__ is str:
            out.append(v)
            continue
        text = done.get(id(v))
        if text is None:
            pairs, kwargs = v
            text = done[id(v)] = json.dumps({"args": [list(p) for p in pairs], "kwargs": kwargs}, default=str)
        out.append(text)
    return out


def rows_to_table(rows: list[list[Any]]) -> pa.Table:
    """Build the on-disk table from capture rows; statistics are expanded into columns.

    Transposed with ``zip`` (C speed): this runs on the writer thread while the next
    training step runs, and every Python-level loop here would take the GIL from it.
    """
    columns: list[Sequence[Any]] = list(zip(*rows, strict=True))
    if not columns:
        return SCHEMA.empty_table()
    stats = list(zip(*columns[STATS], strict=True))
    if stats:
        stats[_HASH] = tuple(None if v is None else v & 0xFFFFFFFFFFFFFFFF for v in stats[_HASH])
    columns[COL["args"]] = _encode_args(columns[COL["args"]])
    arrays = []
    for field in SCHEMA:
        i = _STAT_INDEX.get(field.name)
        values = stats[i] if i is not None else columns[COL[field.name]]
        arrays.append(pa.array(values, type=field.type))
    return pa.Table.from_arrays(arrays, schema=SCHEMA)
