"""The common shape of a peer dump: records per (rank, step) built by a reader, tensors on demand."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from opscope.errors import DumpFormatError
from opscope.storage import format as fmt
from opscope.storage.reader import Dump, place_view

# (rank, step, data, key) -> (dtype name as in the record, array). bfloat16 comes back as its
# uint16 bit pattern and float8 as uint8 (as in safetensors); the dump widens them to float32.
TensorOpener = Callable[[int, int, str, str], tuple[str, np.ndarray]]


class PeerDump(Dump):
    """A dump written by another tool, presented with :class:`~opscope.storage.reader.Dump`'s API.

    A reader builds it with the tool's name, a manifest (``level``, ``framework``, ``tool``
    and what the tool records), the (rank, step) partitions on disk, a function that builds
    one partition's records as an Arrow table with :data:`opscope.storage.format.SCHEMA`, and
    one that reads a record's tensor (its ``data`` and ``key`` columns, both chosen by the
    reader). Records are built once per partition and kept.
    """

    def __init__(self, path: str | Path, manifest: dict[str, Any], partitions: list[tuple[int, int]],
                 build: Callable[[int, int], pa.Table], open_tensor: TensorOpener | None = None,
                 problems: list[str] | None = None) -> None:
        self.path = Path(path)
        self.manifest = {"status": "complete", **manifest}
        self.problems = list(problems or [])
        self._shards = {}
        self._partitions = sorted(partitions)
        self._build = build
        self._open_tensor = open_tensor
        self._tables: dict[tuple[int, int], pa.Table] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r}, tool={self.manifest.get('tool')!r}, ranks={self.ranks})"

    @property
    def rank_status(self) -> dict[int, dict[str, Any]]:
        return {r: {"status": "complete"} for r in sorted({r for r, _ in self._partitions})}

    def steps(self, rank: int | None = None) -> list[int]:
        return sorted({s for r, s in self._partitions if rank is None or r == rank})

    def partitions(self) -> list[tuple[int, int]]:
        return list(self._partitions)

    def records(self, rank: int | None = None, step: int | None = None,
                columns: list[str] | None = None) -> pa.Table:
        tables = []
        for r, s in self._partitions:
            if (rank is not None and r != rank) or (step is not None and s != step):
                continue
            if (r, s) not in self._tables:
                self._tables[(r, s)] = self._build(r, s).cast(fmt.SCHEMA)
            tables.append(self._tables[(r, s)])
        table = pa.concat_tables(tables) if tables else fmt.SCHEMA.empty_table()
        return table.select(columns) if columns is not None else table

    def tensor(self, rank: int, step: int, data: str | None, key: str | None, raw: bool = False,
               view: str | None = None) -> np.ndarray:
        if not data or not key or self._open_tensor is None:
            raise DumpFormatError(f"this {self.manifest.get('tool', 'peer')} record holds statistics only; "
                                  "dump tensors with the tool to compare full tensors")
        dtype, arr = self._open_tensor(rank, step, data, key)
        if not raw:
            from opscope.storage.safetensors_io import widen

            arr = widen(arr, dtype)
        return place_view(arr, json.loads(view)) if isinstance(view, str) and view else arr

    def tensor_extent(self, rank: int, step: int, data: str | None, key: str | None) -> None:
        """None: a peer's tensors are decoded by its reader, never read in place."""
        return None
