"""The native dump's rows as an Arrow table, built from the columns of
``_opscope_dump.take_columns`` (buffers of numbers and indices into a list of names) without a
Python object per value: on the training thread this costs a few hundred microseconds a
step, and the writer thread has nothing left to convert (see ``_c/dumpobs_module.h``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from opscope.model.records import STAT_NAMES
from opscope.storage.format import SCHEMA

_INTS = ("id", "seq", "call", "slot", "numel", "producer")
_STRS = ("phase", "module", "op", "io", "arg", "dtype", "device", "param", "fwd_op", "node", "note")
_NULL = ("data", "key", "source", "view")


class Columns:
    """One step's columns; statistics stay writable until :meth:`table` (Python fills those
    of tensors the kernel could not read, and their links)."""

    def __init__(self, raw: tuple[Any, ...], rank: int, step: int) -> None:
        (self.n, ints, strs, names, self.args, offsets, values, sf, si, valid, self.links) = raw
        n = self.n
        self.ints = np.frombuffer(ints, dtype=np.int64).reshape(len(_INTS), n)
        self.strs = np.frombuffer(strs, dtype=np.int32).reshape(len(_STRS), n)
        self.names = pa.array(names, type=pa.string())
        self.offsets = np.frombuffer(offsets, dtype=np.int32)
        self.values = np.frombuffer(values, dtype=np.int64)
        self.sf = np.frombuffer(sf, dtype=np.float64).reshape(6, n).copy()
        self.si = np.frombuffer(si, dtype=np.uint64).reshape(4, n).copy()
        self.valid = np.frombuffer(valid, dtype=np.uint16).copy()
        self.rank, self.step = rank, step

    def set_stats(self, i: int, stats: tuple[Any, ...]) -> None:
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
        for name in _NULL:
            arrays[name] = pa.nulls(n, type=pa.string())
        return pa.Table.from_arrays([arrays[f.name].cast(f.type) for f in SCHEMA], schema=SCHEMA)
