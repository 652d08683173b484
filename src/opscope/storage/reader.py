"""Lazy reader of opscope dumps. No torch, no pickle."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from opscope.errors import DumpFormatError
from opscope.storage import format as fmt
from opscope.storage.safetensors_io import ShardReader, TensorExtent


def load(path: str | os.PathLike) -> Dump:
    """Open a dump written by :func:`opscope.dump` (or ``dump-onnx``, or the flight recorder).

    A folder without opscope's manifest is tried against the peer formats
    (:mod:`opscope.storage.peers`: msprobe, MindSpore's Data Dump).

    Raises:
        DumpFormatError: no dump there, or one written by a newer opscope.
    """
    p = Path(path)
    if p.is_dir() and not (p / fmt.MANIFEST).is_file():
        for opener in PEER_OPENERS:
            peer = opener(p)
            if peer is not None:
                return peer
    return Dump(path)


# Openers of other tools' dumps, tried in order on a folder without opscope's manifest;
# ``opscope.storage.peers`` adds its own when the storage package is imported.
PEER_OPENERS: list[Callable[[Path], Dump | None]] = []


class Dump:
    """A dump on disk. Records are read lazily, per rank and step, as Arrow tables.

    ``problems`` lists what could not be read (a truncated shard, a run still marked
    running), each as a sentence; nothing is skipped without an entry there.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        manifest = self.path / fmt.MANIFEST
        if not self.path.is_dir():
            raise DumpFormatError(f"{str(self.path)!r} is not a directory; give the path of an opscope dump")
        if not manifest.is_file():
            raise DumpFormatError(f"{str(self.path)!r} has no {fmt.MANIFEST}: it is not an opscope dump "
                                  "(or its run never started writing), nor an msprobe or MindSpore dump "
                                  "(give the dump root, a step folder or a rank folder)")
        try:
            self.manifest: dict[str, Any] = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise DumpFormatError(f"{str(manifest)!r} is unreadable ({exc})") from None
        version = str(self.manifest.get("format_version", "0"))
        if fmt.major(version) > fmt.major(fmt.FORMAT_VERSION):
            raise DumpFormatError(
                f"{str(self.path)!r} uses dump format {version}, newer than this opscope reads "
                f"({fmt.FORMAT_VERSION}); upgrade opscope (pip install -U opscope)")
        self.problems: list[str] = []
        self._shards: dict[str, ShardReader] = {}
        self._batches: dict[int, tuple[int, list[tuple[Path, int, int]]]] = {}  # rank -> (folder mtime, files)
        self._batch_steps: dict[Path, list[int]] = {}  # a batch file -> the steps it holds
        self._batch_read: tuple[Any, pa.Table | None] = (None, None)  # the last batch file read
        if self.status == "running":
            self.problems.append(f"{self.path} is still marked running: its last steps may be missing")
        elif self.status == "crashed":
            self.problems.append(f"{self.path} is from a run that crashed: {self.error or 'see rank.json'}")
        runs = {s.get("run_id") for s in self.rank_status.values()}
        if len(runs) > 1:
            self.problems.append(f"{self.path} mixes rank folders of different runs (run ids "
                                 f"{sorted(map(str, runs))}); "
                                 "dump again with overwrite=True")

    def __repr__(self) -> str:
        return f"Dump({str(self.path)!r}, status={self.status!r}, ranks={self.ranks})"

    # -- layout ----------------------------------------------------------------------
    @cached_property
    def rank_status(self) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for d in self.path.glob("rank*"):
            m = re.fullmatch(r"rank(\d+)", d.name)
            if m and d.is_dir():
                try:
                    out[int(m.group(1))] = json.loads((d / fmt.RANK_STATUS).read_text())
                except (OSError, ValueError):
                    out[int(m.group(1))] = {"status": "unknown"}
        return dict(sorted(out.items()))

    @property
    def ranks(self) -> list[int]:
        return list(self.rank_status)

    @property
    def status(self) -> str:
        states = {s.get("status") for s in self.rank_status.values()} or {self.manifest.get("status")}
        for state in ("crashed", "running", "unknown"):
            if state in states:
                return state
        return "complete"

    @property
    def error(self) -> str | None:
        return next((s["error"] for s in self.rank_status.values() if s.get("error")), None)

    def steps(self, rank: int | None = None) -> list[int]:
        """Steps present on disk for ``rank`` (all ranks when None): step folders, and the steps
        of the rank's files of several steps' rows (format 3.0: such a step has no folder)."""
        ranks = self.ranks if rank is None else [rank]
        found: set[int] = set()
        for r in ranks:
            for d in fmt.rank_dir(self.path, r).glob("step*"):
                m = re.fullmatch(r"step(\d+)", d.name)
                if m and d.is_dir():
                    found.add(int(m.group(1)))
            for f, _, _ in self._batch_files(r):
                found.update(self._steps_in(f))
        return sorted(found)

    def _steps_in(self, f: Path) -> list[int]:
        """The steps a file of several steps' rows holds: listed in its metadata (format 3.0),
        else (2.0, whose steps have folders anyway) read from its ``step`` column."""
        steps = self._batch_steps.get(f)
        if steps is None:
            from opscope.storage import index_file

            try:
                listed = index_file.key_value(f).get(fmt.BATCH_STEPS.encode())
                steps = (fmt.steps_of_runs(listed) if listed is not None else
                         sorted(set(index_file.read(f, ["step"]).column("step").to_pylist())))
            except Exception as exc:  # pyarrow raises several types for corrupt files
                msg = f"skipped {f.relative_to(self.path)}: unreadable ({type(exc).__name__}: {exc})"
                if msg not in self.problems:
                    self.problems.append(msg)
                steps = []
            self._batch_steps[f] = steps
        return steps

    def partitions(self) -> list[tuple[int, int]]:
        """Every (rank, step) present on disk."""
        return [(r, s) for r in self.ranks for s in self.steps(r)]

    @property
    def size_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.path.rglob("*") if f.is_file())

    # -- records ---------------------------------------------------------------------
    def records(self, rank: int | None = None, step: int | None = None,
                columns: list[str] | None = None) -> pa.Table:
        """Index rows as one Arrow table (``.to_pandas()`` for a DataFrame).

        Unreadable shards are skipped and named in :attr:`problems`.
        """
        tables = []
        parts = [(rank, step)] if rank is not None and step is not None else [
            (r, s) for r, s in self.partitions() if (rank is None or r == rank) and (step is None or s == step)]
        for r, s in parts:
            folder = fmt.step_dir(self.path, r, s)
            files: list[tuple[Path, int | None]] = [(f, None) for f in sorted(folder.glob("records-*.parquet"))]
            files += [(f, s) for f, first, last in self._batch_files(r) if first <= s <= last]
            for f, step in files:
                try:
                    tables.append(self._read_index(f, columns) if step is None else self._batch_rows(f, step, columns))
                except Exception as exc:  # pyarrow raises several types for corrupt files
                    msg = f"skipped {f.relative_to(self.path)}: unreadable ({type(exc).__name__}: {exc})"
                    if msg not in self.problems:
                        self.problems.append(msg)
        if not tables:
            schema = fmt.SCHEMA if columns is None else pa.schema([fmt.SCHEMA.field(c) for c in columns])
            return schema.empty_table()
        table = pa.concat_tables(tables, promote_options="default")
        for name in columns or ():
            if name not in table.column_names:  # an index written before the column was (format 1.0: view)
                column = fmt.SCHEMA.field(name)
                table = table.append_column(column, pa.nulls(table.num_rows, column.type))
        return table.select(columns) if columns else table

    @staticmethod
    def _read_index(f: Path, columns: list[str] | None) -> pa.Table:
        from opscope.storage import index_file  # not read_table: it imports pyarrow.dataset (~0.25 s)

        return index_file.read(f, columns)

    def _batch_files(self, rank: int) -> list[tuple[Path, int, int]]:
        """A rank's files of several steps' rows (format 2.0), with the steps they hold, first
        to last; listed again when the rank's folder changed (a dump still being written)."""
        folder = fmt.rank_dir(self.path, rank)
        try:
            mtime = folder.stat().st_mtime_ns
        except OSError:
            return []
        known = self._batches.get(rank)
        if known is None or known[0] != mtime:
            found = [(f, int(m.group(1)), int(m.group(2))) for f in sorted(folder.glob("records-*.parquet"))
                     if (m := fmt.BATCH_FILE.fullmatch(f.name))]
            known = self._batches[rank] = (mtime, found)
        return known[1]

    def _batch_rows(self, f: Path, step: int, columns: list[str] | None) -> pa.Table:
        """The rows of ``step`` in a file of several steps' rows. The file is read once for
        its steps read in turn (the last one read is kept)."""
        key = (f, None if columns is None else tuple(columns))
        if self._batch_read[0] != key:
            self._batch_read = (None, None)  # the earlier one goes before the next is read
            wanted = None if columns is None else list(dict.fromkeys([*columns, "step"]))
            read = self._read_index(f, wanted)  # without the file's list of steps (format 3.0)
            self._batch_read = (key, read.replace_schema_metadata(None))
        table = self._batch_read[1]
        assert table is not None
        steps = table.column("step").to_numpy()
        if steps.size > 1 and bool((steps[1:] < steps[:-1]).any()):  # not in step order (never written so)
            part = table.take(pa.array(np.flatnonzero(steps == step)))
        else:  # a step's rows follow each other: a slice, no copy
            first, end = np.searchsorted(steps, step, "left"), np.searchsorted(steps, step, "right")
            part = table.slice(int(first), int(end - first))
        return part if columns is None or "step" in columns else part.drop_columns(["step"])

    # -- tensors ---------------------------------------------------------------------
    def tensor(self, rank: int, step: int, data: str | None, key: str | None, raw: bool = False,
               view: str | None = None) -> np.ndarray:
        """The full tensor of one record (its ``data`` and ``key`` columns) as numpy.

        bfloat16 and float8 are widened to float32 exactly unless ``raw`` is set.

        Raises:
            DumpFormatError: the record has no tensor (statistics-only dump) or its shard is unreadable.
        """
        shard, key = self._shard(rank, step, data, key)
        dtype, arr = shard.raw(key)
        if not raw:
            from opscope.storage.safetensors_io import widen

            arr = widen(arr, dtype)
        return place_view(arr, json.loads(view)) if isinstance(view, str) and view else arr

    def tensor_extent(self, rank: int, step: int, data: str | None, key: str | None) -> TensorExtent | None:
        """Where a record's tensor lies in its shard, to read it piece by piece (compare
        streams tensors so); None where the tensor is not stored as one run of bytes in a
        file of this dump (a peer dump's tensors are decoded by its reader).

        Raises:
            DumpFormatError: as :meth:`tensor`.
        """
        shard, key = self._shard(rank, step, data, key)
        return shard.extent(key)

    def _shard(self, rank: int, step: int, data: str | None, key: str | None) -> tuple[ShardReader, str]:
        if not data or not key:
            raise DumpFormatError("this record holds statistics only; dump with data=\"tensor\" "
                                  "(or tensor_ops) to keep full tensors")
        if "/" in data or "\\" in data or data.startswith("."):
            raise DumpFormatError(f"refusing tensor file name {data!r}: not a shard of this dump")
        path = fmt.step_dir(self.path, rank, step) / data
        shard = self._shards.get(str(path))
        if shard is None:
            shard = self._shards[str(path)] = ShardReader(path)
        return shard, key

    def row_tensor(self, row: dict[str, Any], raw: bool = False) -> np.ndarray:
        """The full tensor of a record given as a dict (e.g. one row of ``records().to_pylist()``).

        A view recorded with full tensors shares its input's data; its ``view`` column places
        it in that data (shape, strides and offset in elements), and the view is rebuilt here.
        """
        arr = self.tensor(row["rank"], row["step"], row.get("data"), row.get("key"), raw=raw, view=row.get("view"))
        if str(row.get("dtype", "")).startswith("complex") and not raw:
            arr = arr.view(np.complex64 if arr.dtype == np.float32 else np.complex128)[..., 0]
        return arr

    def close(self) -> None:
        """Close the tensor shards read so far (a later read opens its shard again)."""
        for shard in self._shards.values():
            shard.close()
        self._shards.clear()


def place_view(base: np.ndarray, geometry: dict[str, Any]) -> np.ndarray:
    """Rebuild a view from its base's contiguous data, as a new array (never aliasing the file)."""
    flat = np.ascontiguousarray(base).reshape(-1)
    shape, stride, offset = geometry["shape"], geometry["stride"], int(geometry["offset"])
    extent = offset + sum((n - 1) * st
                          for n, st in zip(shape, stride, strict=True) if n > 0) + 1 if all(shape) else offset
    if offset < 0 or extent > flat.size or any(st < 0 for st in stride):
        raise DumpFormatError(f"view geometry {geometry} does not fit its data ({flat.size} elements)")
    view = np.lib.stride_tricks.as_strided(flat[offset:], shape=shape, strides=[st * flat.itemsize for st in stride],
                                           writeable=False)
    return np.array(view)
