"""What the Python path's recorder knows of writes (the half of
:class:`~opscope.capture.torch.recorder.Recorder` that follows memory written in place, by ops
and by what no op records, and memory that holds no data yet)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from opscope.capture.torch.modules import PLAIN_TENSORS, local
from opscope.model.records import COL, WRITTEN_NOTE

if TYPE_CHECKING:
    from opscope.capture.torch.dataflow import DataFlow
    from opscope.capture.torch.unfilled import Unfilled
    from opscope.capture.torch.worker import NativeStats


_NOTE = COL["note"]


class Writes:
    """In-place writes, and memory that holds no data yet."""

    flow: DataFlow
    unfilled: Unfilled
    worker: NativeStats | None
    want_outputs: bool

    def record_written(self, call: tuple[Any, ...], t: torch.Tensor) -> None:
        """An API call (``call``, :meth:`record_inputs`'s) wrote ``t``, its first argument, in
        place and returned nothing (``Tensor.__setitem__``): an output row, not measured, that
        ``t``'s next read (and its base's) has for its producer; that read measures it
        (dumpobs_api.h api_end, natively)."""
        if not self.want_outputs:
            return
        row = self._new_row(call[0], "output", 0, None, t)  # type: ignore[attr-defined]
        row[_NOTE] = WRITTEN_NOTE
        self.flow.written_here(t, row)

    def holds_no_data(self, t: Any) -> bool:
        """Is ``t`` memory that holds no data yet (an empty's, written since only in part)?"""
        if not isinstance(t, torch.Tensor):
            return False
        entry = self.flow.find(t)
        if entry is not None:
            return self.unfilled.holds_none(entry[1])
        made = self.flow.stale(t)  # written since, through views of it, maybe only in part
        return made is not None and self.unfilled.holds_none(made) and self.flow.result_of(t) is None

    def _unmeasure(self, t: torch.Tensor) -> None:
        """``t`` is overwritten unread: a view read of it is taken back (unfilled.py)."""
        entry = self.flow.find(t)  # (statistics still pending are dropped at the step's end)
        if entry is not None:
            self.unfilled.overwritten(entry[1])

    def foreign_write(self, read: list[torch.Tensor], written: list[torch.Tensor]) -> None:
        """An op of a thread doing a collective's work read ``read`` and wrote ``written``: the
        writes are counted, and where it read a collective's result (a communication hook's
        decompression into DDP's bucket), what it wrote holds that result."""
        source = next((r for r in map(self.flow.result_of, read) if r is not None), None)
        for t in written:
            self.before_write(t)
            if source is not None:
                self.flow.holds_result(t, source)

    def before_write(self, t: torch.Tensor) -> None:
        """``t`` is about to be written in place: the statistics still to be taken of its storage
        are taken, views registered on it forgotten, and the write counted, so that no row made
        before it is taken for a tensor of that storage again, also one whose version counter
        does not move (``p`` after ``p.data.add_()``, batch norm's running statistics)."""
        if type(t) not in PLAIN_TENSORS:
            t = local(t)  # a DTensor writes the shard it holds, out of this dispatch mode's sight
        self.flow.before_write(t)
        if self.worker is not None:
            self.worker.before_write(t)
