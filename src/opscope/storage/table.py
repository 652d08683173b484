"""Conversion of capture rows (lists in COLUMNS order) to Arrow tables in SCHEMA order."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from opscope.model.records import COL, STAT_NAMES, STATS
from opscope.storage.format import SCHEMA


def rows_to_table(rows: list[list[Any]]) -> pa.Table:
    """Build the on-disk table from capture rows; statistics are expanded into columns."""
    stat_index = {name: i for i, name in enumerate(STAT_NAMES)}
    arrays = []
    for field in SCHEMA:
        if field.name in stat_index:
            i = stat_index[field.name]
            values = [row[STATS][i] for row in rows]
            if field.name == "hash":
                values = [None if v is None else v & 0xFFFFFFFFFFFFFFFF for v in values]
        else:
            c = COL[field.name]
            values = [row[c] for row in rows]
        arrays.append(pa.array(values, type=field.type))
    return pa.Table.from_arrays(arrays, schema=SCHEMA)
