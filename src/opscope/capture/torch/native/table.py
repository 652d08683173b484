"""The native dump's rows as an Arrow table, built from the columns of
``_opscope_dump.take_columns`` (buffers of numbers and indices into a list of names) without a
Python object per value. Building it costs a few hundred microseconds a step whatever the
number of rows; the dump writer's thread does it (:meth:`Columns.table`), mostly while the
training thread runs torch code without the GIL (see ``_c/dumpobs_module.h``). The rows
become those columns there too: the training thread only takes them (``_c/dumpobs_columns.h``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from opscope.model.records import STAT_NAMES
from opscope.storage.arrow_build import POOL, numbers, texts
from opscope.storage.format import SCHEMA

_INTS = ("id", "seq", "call", "slot", "numel", "producer")
_STRS = ("phase", "module", "op", "io", "arg", "dtype", "device", "param", "fwd_op", "node", "note", "data")


class Columns:
    """One step's columns. Cheap to make: ``taken`` is ``take_columns()``'s (rows, the callable
    that makes the columns' buffers), called by :meth:`table`, which the dump writer calls on its
    own thread. Statistics that Python measured (tensors the kernel could not read, and their
    links) are given with :meth:`set_stats` before that. The arguments come as the observer's
    records, made JSON by ``args_json`` (the module's function of that name) on the writer's
    thread too."""

    def __init__(self, taken: tuple[int, Callable[[], tuple[Any, ...]]], rank: int, step: int,
                 args_json: Callable[..., tuple[bytes, bytes, bytes]] | None = None) -> None:
        self.n, self._build = taken
        self._raw: tuple[Any, ...] | None = None
        self.args_json = args_json
        self.rank, self.step = rank, step
        self._stats: dict[int, tuple[Any, ...]] = {}

    @property
    def num_rows(self) -> int:
        return self.n

    @property
    def raw(self) -> tuple[Any, ...]:
        """The columns' buffers (see ``py_build_columns``), made on first use."""
        if self._raw is None:
            self._raw = self._build()
        return self._raw

    @property
    def links(self) -> list[tuple[int, int]]:
        """(row, the row whose statistics Python measured) for rows linked to such a row."""
        return self.raw[10]

    def set_stats(self, i: int, stats: tuple[Any, ...]) -> None:
        self._stats[i] = stats

    def _parse(self) -> None:
        (n, ints, strs, names, args, offsets, values, sf, si, valid, _, keys, views) = self.raw
        # (records, offset of each row's record): JSON here; an older build's string buffers as they are
        self.args = args if len(args) == 3 else self._json(n, args[0], args[1], names)
        self.ints = np.frombuffer(ints, dtype=np.int64).reshape(len(_INTS), n)
        self.strs = np.frombuffer(strs, dtype=np.int32).reshape(len(_STRS), n)
        self.names = names
        self.offsets = np.frombuffer(offsets, dtype=np.int32)
        self.values = np.frombuffer(values, dtype=np.int64)
        self.sf = np.frombuffer(sf, dtype=np.float64).reshape(6, n)
        self.si = np.frombuffer(si, dtype=np.uint64).reshape(4, n)
        self.valid = np.frombuffer(valid, dtype=np.uint16)
        # Arrow string buffers (offsets, characters, validity bits): no Python object per row
        self.keys, self.views = keys, views
        if self._stats:
            self.sf, self.si, self.valid = self.sf.copy(), self.si.copy(), self.valid.copy()
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

    def _json(self, n: int, records: bytes, at: bytes, names: list[str]) -> tuple[bytes, bytes, bytes]:
        if self.args_json is None:
            raise ValueError("Columns: the observer's args_json is needed to read its argument records")
        return self.args_json(n, records, at, names)

    def table(self) -> pa.Table:
        """The Arrow table in :data:`SCHEMA` order."""
        return Columns.batch_table([self])

    @staticmethod
    def batch_table(parts: list[Columns]) -> pa.Table:
        """One Arrow table of several steps' columns, in order (the dump writer's file of
        several small steps): the numbers are joined as arrays and the names looked up once,
        so a step adds tens of microseconds, where a table of its own costs hundreds."""
        for c in parts:
            c._parse()
        n = sum(c.n for c in parts)
        names, strs = _joined_names(parts)
        arrays: dict[str, pa.Array] = {}
        ints = np.concatenate([c.ints for c in parts], axis=1)
        for k, name in enumerate(_INTS):
            col = ints[k]
            mask = col < 0 if name == "producer" else None
            arrays[name] = numbers(col if name in ("id", "seq", "numel", "producer") else col.astype(np.int32), mask)
        dictionary = texts(names)
        for k, name in enumerate(_STRS):
            idx = strs[k]
            arrays[name] = pc.take(dictionary, numbers(idx, idx < 0), memory_pool=POOL)
        arrays["rank"] = numbers(np.repeat(np.array([c.rank for c in parts], dtype=np.int32), [c.n for c in parts]))
        arrays["step"] = numbers(np.repeat(np.array([c.step for c in parts], dtype=np.int32), [c.n for c in parts]))
        arrays["shape"] = _shapes(parts)
        sf = np.concatenate([c.sf for c in parts], axis=1)
        si = np.concatenate([c.si for c in parts], axis=1)
        valid = np.concatenate([c.valid for c in parts])
        for k, name in enumerate(STAT_NAMES):
            present = (valid >> k) & 1 == 1
            data = sf[k] if k < 6 else si[k - 6]
            if name in ("nan", "inf", "zeros"):
                data = data.astype(np.int64)
            arrays[name] = numbers(data, ~present)
        arrays["args"] = _joined(_strings(c.n, c.args) for c in parts)
        arrays["key"] = _joined(_strings(c.n, c.keys) for c in parts)
        arrays["view"] = _joined(_strings(c.n, c.views) for c in parts)
        arrays["source"] = pa.nulls(n, type=pa.string(), memory_pool=POOL)
        return pa.Table.from_arrays([_as(arrays[f.name], f.type) for f in SCHEMA], schema=SCHEMA)


def _joined_names(parts: list[Columns]) -> tuple[list[str], np.ndarray]:
    """One list of names for several steps, and their string columns as indices into it.
    Steps in a row usually have the very same names (the observer keeps them): looked up once."""
    index: dict[str, int] = {}
    last: list[str] | None = None
    remap = np.empty(0, dtype=np.int32)
    out = []
    for c in parts:
        if c.names is not last and c.names != last:
            # the last entry maps -1 (no value) to itself
            remap = np.array([*(index.setdefault(s, len(index)) for s in c.names), -1], dtype=np.int32)
            last = c.names
        out.append(remap[c.strs])
    return list(index), out[0] if len(out) == 1 else np.concatenate(out, axis=1)


def _shapes(parts: list[Columns]) -> pa.Array:
    if len(parts) == 1:
        return pa.ListArray.from_arrays(numbers(parts[0].offsets), numbers(parts[0].values), pool=POOL)
    offsets, base = [], 0
    for c in parts:
        offsets.append(c.offsets[:-1] + base)
        base += len(c.values)
    offsets.append(np.array([base], dtype=np.int32))
    return pa.ListArray.from_arrays(numbers(np.concatenate(offsets).astype(np.int32)),
                                    numbers(np.concatenate([c.values for c in parts])), pool=POOL)


def _joined(arrays: Iterable[pa.Array]) -> pa.Array:
    parts = list(arrays)
    return parts[0] if len(parts) == 1 else pa.concat_arrays(parts, memory_pool=POOL)


def _as(array: pa.Array, type_: pa.DataType) -> pa.Array:
    return array if array.type == type_ else array.cast(type_, memory_pool=POOL)


def _strings(n: int, buffers: tuple[bytes, bytes, bytes]) -> pa.Array:
    """A string column from Arrow's own buffers (offsets, characters, validity bits), built natively."""
    offsets, chars, bits = buffers
    if not chars:  # no value (keys and geometries are never empty)
        return pa.nulls(n, type=pa.string(), memory_pool=POOL)
    return pa.Array.from_buffers(pa.string(), n, [pa.py_buffer(bits), pa.py_buffer(offsets), pa.py_buffer(chars)])
