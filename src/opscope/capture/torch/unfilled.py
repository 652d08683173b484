"""Memory that holds no data yet, on the Python capture path (natively: dumpobs.cpp's
``Row::marks``, ``NODATA`` and ``VIEW_READ``).

- An empty-like op's output, and a view of one, hold no data: an op that only views them is
  linked to them, unmeasured; an op that reads them measures what is there (a custom kernel may
  have filled empty_like's memory without an op). DDP's bucket is an ``empty`` whose views
  become the gradients' places, filled through ``mul(out=...)``.
- A read by an op that only views a tensor (no element read) of memory no row holds is measured,
  and taken back when that memory is then overwritten unread before any op read its data:
  FSDP gives its unsharded parameters' memory back after the forward and allocates it again
  without an op (``storage().resize_()``), views it, and fills it by
  ``split_with_sizes_copy(out=views)``.
"""

from __future__ import annotations

from typing import Any

from opscope.model.records import COL, NO_STATS, STATS, UNINITIALIZED_NOTE

_ID, _NOTE, _DATA, _KEY = COL["id"], COL["note"], COL["data"], COL["key"]


class Unfilled:
    """One step's rows that hold no data (by id), and its view reads not read since."""

    def __init__(self) -> None:
        self.nodata: set[int] = set()
        self.view_reads: dict[int, list[Any]] = {}  # row id -> the row, measured by a view op
        self.view_src: dict[int, int] = {}  # row id -> id of the view read whose statistics it has
        self.taken_back: list[list[Any]] = []  # cleared at the step's end (statistics still pending)

    def empty(self, row: list[Any]) -> None:
        """``row`` is an empty-like op's output, or a view of memory that holds no data."""
        row[_NOTE] = UNINITIALIZED_NOTE
        self.nodata.add(row[_ID])

    def holds_none(self, row: list[Any]) -> bool:
        return bool(self.nodata) and row[_ID] in self.nodata

    def read(self, row: list[Any]) -> bool:
        """An op reads the elements of the tensor ``row`` last measured: False when it holds no
        data (it is then measured anew); a view read it had is kept as data."""
        if self.holds_none(row):
            return False
        if self.view_src:
            self.view_reads.pop(self.view_src.get(row[_ID], -1), None)
        return True

    def view_read(self, row: list[Any]) -> None:
        """``row`` was measured anew by an op that only views it."""
        self.view_reads[row[_ID]] = row
        self.view_src[row[_ID]] = row[_ID]

    def carry(self, row: list[Any], src: list[Any]) -> None:
        """``row`` has ``src``'s statistics: so also what is said here of ``src``."""
        if self.holds_none(src):
            self.nodata.add(row[_ID])
        if self.view_src and src[_ID] in self.view_src:
            self.view_src[row[_ID]] = self.view_src[src[_ID]]

    def overwritten(self, row: list[Any]) -> None:
        """The tensor ``row`` last measured is overwritten unread: a view read it had, not read
        by any op since, is taken back."""
        src = self.view_reads.pop(self.view_src.get(row[_ID], -1), None)
        if src is not None:
            self.taken_back += [src, row]

    def finish(self) -> None:
        """The step's statistics are all in: the rows taken back lose theirs."""
        for r in self.taken_back:
            r[STATS], r[_NOTE], r[_DATA], r[_KEY] = NO_STATS, UNINITIALIZED_NOTE, None, None
