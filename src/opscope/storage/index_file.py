"""Reading one index file (``records-*.parquet``) into an Arrow table, cheaply.

``pyarrow.parquet`` imports ``pyarrow.fs`` (and with it ``ssl`` and the cloud file systems),
~15-20 ms of every compare's start-up, to open a local file that its Cython reader
(``pyarrow._parquet.ParquetReader``, what ``pyarrow.parquet.ParquetFile`` wraps) opens by
itself. That reader is used when this pyarrow has it as expected; otherwise
``ParquetFile``, which gives the same table.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa


def _reader_class() -> Any:
    try:
        from pyarrow._parquet import ParquetReader
    except ImportError:
        return None
    needed = ("open", "read_all", "column_paths")
    return ParquetReader if all(hasattr(ParquetReader, name) for name in needed) else None


READER = _reader_class()


@contextmanager
def _opened(path: str | Path) -> Iterator[Any]:
    """The Cython reader opened on ``path``, closed after; None when this pyarrow has none
    as expected (then the caller takes the public API)."""
    if READER is None:
        yield None
        return
    reader = READER()
    try:
        reader.open(str(path), pre_buffer=False)
    except TypeError:  # an open() of another signature: the public reader knows it
        yield None
        return
    try:
        yield reader
    finally:
        close = getattr(reader, "close", None)
        if close is not None:
            close()


def read(path: str | Path, columns: list[str] | None = None) -> pa.Table:
    """The rows of one Parquet file (only ``columns`` when given, in that order).

    Raises:
        pyarrow.ArrowException, OSError: the file is unreadable or not Parquet (as
            ``pyarrow.parquet.ParquetFile`` raises).
    """
    with _opened(path) as reader:
        if reader is None:
            return _read_with_parquet_file(path, columns)
        indices = None if columns is None else _indices(reader.column_paths, columns)
        table: pa.Table = reader.read_all(column_indices=indices, use_threads=True)
        return table


def key_value(path: str | Path) -> dict[bytes, bytes]:
    """The key-value metadata of one Parquet file (its footer only is read)."""
    with _opened(path) as reader:
        if reader is not None:
            return dict(reader.metadata.metadata or {})
    import pyarrow.parquet as pq

    return dict(pq.read_metadata(path).metadata or {})


def _indices(paths: list[list[str]], columns: list[str]) -> list[int]:
    """The leaf columns of each named column (a list column's leaf is ``shape.list.element``),
    in the order named; a name the file lacks has none (as ``ParquetFile.read`` skips it)."""
    leaves: dict[str, list[int]] = {}
    for index, path in enumerate(paths):
        for depth in range(1, len(path) + 1):
            leaves.setdefault(".".join(path[:depth]), []).append(index)
    return [index for name in columns for index in leaves.get(name, [])]


def _read_with_parquet_file(path: str | Path, columns: list[str] | None) -> pa.Table:
    import pyarrow.parquet as pq

    with pq.ParquetFile(path) as index:  # not read_table: it imports pyarrow.dataset (~0.25 s)
        table: pa.Table = index.read(columns=columns)
        return table
