"""One graph run's records as Arrow columns, without a Python object per row.

The fixed columns of a graph's rows (phase, module, op, io, slot, parameter, node...) are
Arrow arrays built once (:class:`GraphColumns`); a run gathers each row's measured value
(``take`` by value index) and numbers the rows. The writer gets the finished table.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from opscope.model.records import STAT_NAMES
from opscope.storage.format import SCHEMA

_STATIC = ("rank", "phase", "module", "op", "io", "slot", "arg", "device", "param", "fwd_op", "node",
           "args", "source", "note")
_TYPES = {f.name: f.type for f in SCHEMA}


# The TensorFlow index files: no Parquet dictionaries or column statistics (the reader uses
# neither; measured on a 2,905-row step: 4.7 -> 3.3 ms of the writer's CPU, 93 -> 78 kB).
PARQUET_OPTIONS = {"use_dictionary": False, "write_statistics": False}


class PendingTable:
    """One graph run's rows, built into an Arrow table on the dump writer's thread
    (:meth:`opscope.storage.writer.DumpWriter.add_table`), off the training step."""

    parquet_options = PARQUET_OPTIONS

    def __init__(self, columns: GraphColumns, values: list[Any], base: int, step: int, seq0: int,
                 offsets: np.ndarray) -> None:
        self.num_rows = len(columns.value)
        self.columns, self.values, self.base, self.step, self.seq0, self.offsets = \
            columns, values, base, step, seq0, offsets

    def table(self) -> pa.Table:
        return self.columns.table(self.values, self.base, self.step, self.seq0, self.offsets)


class GraphColumns:
    """The fixed part of a graph's rows, from its row template's entries."""

    def __init__(self, entries: list[tuple[Any, ...]], columns: dict[str, int], ids: int, ops: int,
                 n_values: int) -> None:
        statics = [e[0] for e in entries]
        self.static = {name: pa.array([row[columns[name]] for row in statics], type=_TYPES[name])
                       for name in _STATIC}
        # constants (index -2 - k) come after the run's values
        self.value = np.array([e[1] if e[1] >= 0 else n_values + (-2 - e[1]) for e in entries], dtype=np.int64)
        self.producer = np.array([-1 if e[2] is None else e[2] for e in entries], dtype=np.int64)
        self.local_id = np.array([e[3] for e in entries], dtype=np.int64)
        self.seq = np.array([e[4] for e in entries], dtype=np.int64)
        self.key = np.array([e[5] for e in entries], dtype=np.int64)
        self.call = np.array([e[6] for e in entries], dtype=np.int64)
        own = [e[7] for e in entries]  # a view's own shape (None: its value's)
        self.own_shapes = [s for s in own if s is not None]
        self.own_rows = np.array([i for i, s in enumerate(own) if s is not None], dtype=np.int64)
        self._own: tuple[int, pa.Array, pa.Array] | None = None  # (values, own shapes, take index)
        self.ids, self.ops = ids, ops

    def table(self, values: list[Any], base: int, step: int, seq0: int, offsets: np.ndarray) -> pa.Table:
        """The run's table; ``values`` are the measured values then the constants (none None)."""
        take = pa.array(self.value)
        cols: dict[str, Any] = dict(self.static)
        n = len(self.value)
        cols["id"] = pa.array(base + self.local_id, type=pa.int64())
        cols["step"] = pa.array(np.full(n, step, dtype=np.int32))
        cols["seq"] = pa.array(seq0 + self.seq, type=pa.int64())
        cols["call"] = pa.array((self.call + offsets[self.key]).astype(np.int32))
        producer = base + self.producer
        cols["producer"] = pa.array(producer, mask=self.producer < 0, type=pa.int64())
        dtypes, shapes, numels, stats, data, keys = zip(*values)  # one pass: a column per field
        cols["dtype"] = pa.array(dtypes, type=pa.string()).take(take)
        cols["numel"] = pa.array(numels, type=pa.int64()).take(take)
        cols["shape"] = self._shapes(list(shapes), take)
        for name, raw in zip(STAT_NAMES, zip(*stats)):
            if name == "hash":
                raw = tuple(None if h is None else h & 0xFFFFFFFFFFFFFFFF for h in raw)
            cols[name] = pa.array(raw, type=_TYPES[name]).take(take)
        cols["data"] = pa.array(data, type=pa.string()).take(take)
        cols["key"] = pa.array(keys, type=pa.string()).take(take)
        cols["view"] = pa.nulls(n, type=pa.string())
        return pa.Table.from_arrays([cols[f.name] for f in SCHEMA], schema=SCHEMA)

    def _shapes(self, value_shapes: list[Any], take: pa.Array) -> pa.Array:
        """Each row's shape: its value's, or its own where the row is a view of another shape
        (those appended after the values, and taken by index)."""
        measured = pa.array(value_shapes, type=_TYPES["shape"])
        if not len(self.own_rows):
            return measured.take(take)
        if self._own is None or self._own[0] != len(value_shapes):  # built once per graph
            index = self.value.copy()
            index[self.own_rows] = len(value_shapes) + np.arange(len(self.own_rows))
            self._own = (len(value_shapes), pa.array(self.own_shapes, type=_TYPES["shape"]), pa.array(index))
        return pa.concat_arrays([measured, self._own[1]]).take(self._own[2])
