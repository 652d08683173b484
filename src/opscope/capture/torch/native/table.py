"""The native dump's rows as an Arrow table, built from the columns of
``_opscope_dump.take_columns`` (buffers of numbers and indices into a list of names) without a
Python object per value. Building it costs a few hundred microseconds a step whatever the
number of rows; the dump writer's thread does it (:meth:`Columns.table`), mostly while the
training thread runs torch code without the GIL (see ``_c/dumpobs_module.h``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from opscope.model.records import STAT_NAMES
from opscope.storage.format import SCHEMA

_INTS = ("id", "seq", "call", "slot", "numel", "producer")
_STRS = ("phase", "module", "op", "io", "arg", "dtype", "device", "param", "fwd_op", "node", "note", "data")


class Columns:
    """One step's columns. Cheap to make: the buffers are read by :meth:`table`, which the
    dump writer calls on its own thread. Statistics that Python measured (tensors the kernel
    could not read, and their links) are given with :meth:`set_stats` before that."""

    def __init__(self, raw: tuple[Any, ...], rank: int, step: int) -> None:
        self.raw = raw
        self.n = raw[0]
        self.links = raw[10]
        self.rank, self.step = rank, step
        self._stats: dict[int, tuple[Any, ...]] = {}

    @property
    def num_rows(self) -> int:
        return self.n

    def set_stats(self, i: int, stats: tuple[Any, ...]) -> None:
        self._stats[i] = stats

    def _parse(self) -> None:
        (n, ints, strs, names, self.args, offsets, values, sf, si, valid, _, keys, views) = self.raw
        self.ints = np.frombuffer(ints, dtype=np.int64).reshape(len(_INTS), n)
        self.strs = np.frombuffer(strs, dtype=np.int32).reshape(len(_STRS), n)
        self.names = pa.array(names, type=pa.string())
        self.offsets = np.frombuffer(offsets, dtype=np.int32)
        self.values = np.frombuffer(values, dtype=np.int64)
        self.sf = np.frombuffer(sf, dtype=np.float64).reshape(6, n).copy()
        self.si = np.frombuffer(si, dtype=np.uint64).reshape(4, n).copy()
        self.valid = np.frombuffer(valid, dtype=np.uint16).copy()
        self.keys, self.views = keys, views  # Arrow string buffers: offsets, characters, validity bits
        for i, stats in self._stats.items():
            bits = 0
            for k, v in enumerate(stats):
                if v is None:
                    continue
                bits |= 1 << k
                if k < 6:
                    self.sf[k, i] = v
                else:
                    self.si[k - 6, i] = int(v) & 0xFFFFFFFFFFFFFFFF
            self.valid[i] = bits

    def table(self) -> pa.Table:
        """The Arrow table in :data:`SCHEMA` order."""
        self._parse()
        n = self.n
        arrays: dict[str, pa.Array] = {}
        for k, name in enumerate(_INTS):
            col = self.ints[k]
            mask = col < 0 if name == "producer" else None
            arrays[name] = pa.array(col if name in ("id", "seq", "numel", "producer") else col.astype(np.int32),
                                    mask=mask)
        for k, name in enumerate(_STRS):
            idx = self.strs[k]
            arrays[name] = pc.take(self.names, pa.array(idx, mask=idx < 0))
        arrays["rank"] = pa.array(np.full(n, self.rank, dtype=np.int32))
        arrays["step"] = pa.array(np.full(n, self.step, dtype=np.int32))
        arrays["shape"] = pa.ListArray.from_arrays(pa.array(self.offsets), pa.array(self.values))
        for k, name in enumerate(STAT_NAMES):
            present = (self.valid >> k) & 1 == 1
            data = self.sf[k] if k < 6 else self.si[k - 6]
            if name in ("nan", "inf", "zeros"):
                data = data.astype(np.int64)
            arrays[name] = pa.array(data, mask=~present)
        arrays["args"] = pa.array(self.args, type=pa.string())
        arrays["key"] = _strings(n, self.keys)
        arrays["view"] = _strings(n, self.views)
        arrays["source"] = pa.nulls(n, type=pa.string())
        return pa.Table.from_arrays([_as(arrays[f.name], f.type) for f in SCHEMA], schema=SCHEMA)


def _as(array: pa.Array, type_: pa.DataType) -> pa.Array:
    return array if array.type == type_ else array.cast(type_)


def _strings(n: int, buffers: tuple[bytes, bytes, bytes]) -> pa.Array:
    """A string column from Arrow's own buffers (offsets, characters, validity bits), built natively."""
    offsets, chars, bits = buffers
    if not chars:  # no value (keys and geometries are never empty)
        return pa.nulls(n, type=pa.string())
    return pa.Array.from_buffers(pa.string(), n, [pa.py_buffer(bits), pa.py_buffer(offsets), pa.py_buffer(chars)])
