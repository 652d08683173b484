"""One graph run's records as Arrow columns, without a Python object per row.

The fixed columns of a graph's rows (phase, module, op, io, slot, parameter, node...) are
Arrow arrays built once (:class:`GraphColumns`); a run gathers each row's measured value
(``take`` by value index) and numbers the rows. The writer gets the finished table.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa

from opscope.capture.tensorflow import absent
from opscope.capture.tensorflow import stats as st
from opscope.capture.tensorflow.stats import Measured
from opscope.model.records import STAT_NAMES
from opscope.storage.format import LEAN_PARQUET, SCHEMA

_STATIC = ("rank", "phase", "module", "op", "io", "slot", "arg", "device", "param", "fwd_op", "node",
           "args", "source", "note")
_TYPES = {f.name: f.type for f in SCHEMA}


PARQUET_OPTIONS = LEAN_PARQUET  # the TensorFlow index files' options


def measure(plan: Any, arrays: list[Any]) -> Measured:
    """A graph run's values (numpy arrays; a 0-d tensor comes as a numpy scalar) as columns.
    Their dtype names are the graph's, the same every run: taken once per plan. A graph whose
    statistics its ``OpscopeStats`` op measured hands over that op's outputs instead
    (:func:`opscope.capture.tensorflow.opstats.measured`)."""
    if "in_graph" in plan.__dict__:
        from opscope.capture.tensorflow.opstats import measured

        return measured(plan, arrays)
    arrays = [np.asarray(a) for a in arrays]
    stats, nulls = st.many_columns(arrays)
    dtypes = plan.__dict__.get("value_dtypes")
    if dtypes is None or len(dtypes) != len(arrays):
        dtypes = plan.__dict__["value_dtypes"] = [st.name_of(a) for a in arrays]
    return absent.mark(plan, Measured(stats, nulls, [a.shape for a in arrays], dtypes))


def measured_constants(plan: Any) -> Measured:
    """A graph's constants (read when it was traced) as columns, measured once."""
    got = plan.__dict__.get("constant_columns")
    if got is None:
        arrays = [np.asarray(c) for c in plan.constants]
        stats, nulls = st.many_columns(arrays)
        got = plan.__dict__["constant_columns"] = Measured(stats, nulls, [a.shape for a in arrays],
                                                           [st.name_of(a) for a in arrays])
    return got


class PendingTable:
    """One graph run's rows, built into an Arrow table on the dump writer's thread
    (:meth:`opscope.storage.writer.DumpWriter.add_table`), off the training step, from the
    statistics columns: no Python object per value or statistic."""

    parquet_options = PARQUET_OPTIONS
    batch_options = True  # the writer may put several steps' runs in one file with these options

    def __init__(self, columns: GraphColumns, run: Measured, constants: Measured, base: int, step: int,
                 seq0: int, offsets: np.ndarray) -> None:
        self.num_rows = len(columns.value)
        self.columns, self.run, self.constants = columns, run, constants
        self.base, self.step, self.seq0, self.offsets = base, step, seq0, offsets

    def table(self) -> pa.Table:
        return self.columns.stats_table(self.run, self.constants, self.base, self.step, self.seq0, self.offsets)


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
        self._described: tuple[Any, list[pa.Array]] | None = None  # stats_table's
        self._notes: tuple[np.ndarray, pa.Array] | None = None  # absent values and their note column
        self.ids, self.ops = ids, ops

    def _numbering(self, base: int, step: int, seq0: int, offsets: np.ndarray) -> dict[str, Any]:
        """The fixed columns and the run's numbers (id, step, seq, call, producer)."""
        cols: dict[str, Any] = dict(self.static)
        cols["id"] = pa.array(base + self.local_id, type=pa.int64())
        cols["step"] = pa.array(np.full(len(self.value), step, dtype=np.int32))
        cols["seq"] = pa.array(seq0 + self.seq, type=pa.int64())
        cols["call"] = pa.array((self.call + offsets[self.key]).astype(np.int32))
        producer = base + self.producer
        cols["producer"] = pa.array(producer, mask=self.producer < 0, type=pa.int64())
        return cols

    def stats_table(self, run: Measured, constants: Measured, base: int, step: int, seq0: int,
                    offsets: np.ndarray) -> pa.Table:
        """The run's table from its values' statistics columns (then the constants'): the rows
        :meth:`~.rows.StepRows.graph_rows` makes of the values' tuples."""
        cols = self._numbering(base, step, seq0, offsets)
        cols["dtype"], cols["numel"], cols["shape"] = self._describe(run, constants)
        if run.absent is not None:
            cols["note"] = self._absent_notes(run.absent)
        # taken as uint64: the hash's bits must not pass through floating-point registers
        raw = np.concatenate([run.stats, constants.stats], axis=1).view(np.uint64)[:, self.value]
        nulls = None
        if run.nulls is not None or constants.nulls is not None:
            nulls = np.concatenate([np.zeros(run.stats.shape, bool) if run.nulls is None else run.nulls,
                                    np.zeros(constants.stats.shape, bool) if constants.nulls is None
                                    else constants.nulls], axis=1)[:, self.value]
        views = [np.float64] * 6 + [np.int64] * 3 + [np.uint64]
        for k, (name, kind) in enumerate(zip(STAT_NAMES, views, strict=True)):
            cols[name] = pa.array(raw[k].view(kind), mask=None if nulls is None else nulls[k], type=_TYPES[name])
        n = len(self.value)
        for name in ("data", "key", "view"):
            cols[name] = pa.nulls(n, type=pa.string())
        return pa.Table.from_arrays([cols[f.name] for f in SCHEMA], schema=SCHEMA)

    def _describe(self, run: Measured, constants: Measured) -> list[pa.Array]:
        """The rows' dtype, numel and shape columns: made again only when the values' shapes
        differ from the last run's (a graph's dtypes are its own)."""
        if self._described is None or self._described[0] != run.shapes:
            shapes = [None if s is None else list(s) for s in [*run.shapes, *constants.shapes]]
            take = pa.array(self.value)
            numels = [None if s is None else math.prod(s) for s in shapes]
            self._described = (run.shapes, [pa.array(run.dtypes + constants.dtypes, type=pa.string()).take(take),
                                            pa.array(numels, type=pa.int64()).take(take),
                                            self._shapes(shapes, take)])
        return self._described[1]

    def _absent_notes(self, gone: np.ndarray) -> pa.Array:
        """The note column, with :data:`.absent.NOTE` on the rows of absent values (made
        once per set of them: a graph's are the same every run)."""
        if self._notes is None or not np.array_equal(self._notes[0], gone):
            notes = self.static["note"].to_numpy(zero_copy_only=False).copy()
            notes[np.isin(self.value, gone)] = absent.NOTE
            self._notes = (gone, pa.array(notes, type=_TYPES["note"]))
        return self._notes[1]

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
