"""The pairs table of a comparison, built a partition at a time, so that it never has to be
held whole.

:func:`opscope.compare` judges each (rank, step) partition on its own and hands its slice of
the pairs table (:func:`opscope.compare.table.pairs_table`) to :meth:`PairsFile.append`.
Slices are kept in memory up to :data:`SPILL_ROWS` rows; beyond that they are written to a
Parquet file in a temporary folder (deleted with the object) as they come, and only a
bounded *preview* stays in memory: the first :data:`PREVIEW_ROWS` failed or unpaired rows and
the first :data:`PREVIEW_ROWS` others, from which the HTML report picks what it embeds.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

SPILL_ROWS = 65_536  # rows held in memory before they go to the file (one Parquet row group each)
PREVIEW_ROWS = 50_000  # failed/unpaired rows, and other rows, kept for the HTML report
FINE = ("identical", "passed")  # statuses the preview keeps only while there is room


class PairsFile:
    """One comparison's pairs table: in memory while small, else a Parquet file.

    Args:
        spill_rows: rows held before they are written out (default :data:`SPILL_ROWS`).
        preview_rows: rows of each kind (failed/unpaired, others) the preview keeps
            (default :data:`PREVIEW_ROWS`).
    """

    def __init__(self, *, spill_rows: int | None = None, preview_rows: int | None = None) -> None:
        self.spill_rows = spill_rows or SPILL_ROWS
        self.preview_rows = preview_rows or PREVIEW_ROWS
        self.num_rows = 0
        self.ranks: set[int] = set()
        self.steps: set[int] = set()
        self.path: Path | None = None  # the Parquet file, once anything was written to it
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._schema: pa.Schema | None = None
        self._writer: Any = None
        self._head: list[pa.Table] | None = []  # the rows while they all fit the preview
        self._kept: dict[bool, list[pa.Table]] = {True: [], False: []}  # important?, slices
        self._kept_rows = {True: 0, False: 0}
        self._cleanup: Any = None

    def append(self, table: pa.Table, rank: int, step: int) -> None:
        """Add the next rows, those of partition (rank, step), in execution order (their
        ``order`` column continues the last)."""
        if not table.num_rows:
            return
        self._schema = self._schema or table.schema
        self.num_rows += table.num_rows
        self.ranks.add(rank)
        self.steps.add(step)
        if self._head is not None and self.num_rows <= self.preview_rows:
            self._head.append(table)  # all rows so far fit the preview: nothing to pick yet
        else:
            for earlier in self._head or ():
                self._keep_preview(earlier)
            self._head = None
            self._keep_preview(table)
        self._pending.append(table)
        self._pending_rows += table.num_rows
        if self._pending_rows >= self.spill_rows:
            self._spill()

    def close(self) -> None:
        """Write what is pending when the table went to a file; then nothing more is appended."""
        if self._writer is not None:
            self._spill()
            self._writer.close()
            self._writer = None

    def table(self) -> pa.Table:
        """The whole table (read back from the file when it went there)."""
        if self.path is None:
            return self._memory()
        self.close()
        import pyarrow.parquet as pq

        with pq.ParquetFile(self.path) as f:  # not read_table: it imports pyarrow.dataset
            return f.read()

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The table's rows, a slice at a time (what a writer streams)."""
        if self.path is None:
            yield from self._memory().to_batches()
            return
        self.close()
        import pyarrow.parquet as pq

        with pq.ParquetFile(self.path) as f:
            yield from f.iter_batches(batch_size=self.spill_rows)

    def preview(self, max_rows: int) -> tuple[pa.Table, bool]:
        """At most ``max_rows`` rows (``max_rows <= preview_rows``), the failed and unpaired
        first, then others in execution order; and whether rows were left out."""
        if self.num_rows <= max_rows:
            return self.table(), False
        important = _concat(self._kept[True], self._schema).slice(0, max_rows)
        rest = _concat(self._kept[False], self._schema).slice(0, max(0, max_rows - important.num_rows))
        return pa.concat_tables([important, rest]).sort_by("order"), True

    @property
    def schema(self) -> pa.Schema | None:
        return self._schema

    def _memory(self) -> pa.Table:
        from opscope.compare.table import pairs_table

        if not self._pending:
            return self._schema.empty_table() if self._schema is not None else pairs_table([])
        if len(self._pending) > 1:
            self._pending = [pa.concat_tables(self._pending).combine_chunks()]
        return self._pending[0]

    def _keep_preview(self, table: pa.Table) -> None:
        if min(self._kept_rows.values()) >= self.preview_rows:
            return
        import pyarrow.compute as pc  # only past PREVIEW_ROWS: it takes ~0.15 s to import

        fine = pc.is_in(table.column("status"), value_set=pa.array(FINE))
        for important, mask in ((True, pc.invert(fine)), (False, fine)):
            room = self.preview_rows - self._kept_rows[important]
            if room <= 0:
                continue
            kept = table.filter(mask).slice(0, room)
            if kept.num_rows:
                self._kept[important].append(kept)
                self._kept_rows[important] += kept.num_rows

    def _spill(self) -> None:
        if not self._pending:
            return
        import pyarrow.parquet as pq

        if self._writer is None:
            folder = tempfile.mkdtemp(prefix="opscope-pairs-")
            self._cleanup = weakref.finalize(self, shutil.rmtree, folder, True)
            self.path = Path(folder) / "pairs.parquet"
            self._writer = pq.ParquetWriter(self.path, self._schema, compression="zstd")
        self._writer.write_table(pa.concat_tables(self._pending), row_group_size=max(self._pending_rows, 1))
        self._pending, self._pending_rows = [], 0


def _concat(tables: list[pa.Table], schema: pa.Schema | None) -> pa.Table:
    if tables:
        return pa.concat_tables(tables)
    return schema.empty_table() if schema is not None else pa.table({})
