"""Each finished step judged and written, off the training thread.

The training thread reads a step's statistics (the passes over the tensors must see them
alive) and hands them over; a background thread runs the detector, keeps the rows for the
Parquet writer and reports events. A flight recorder has to be triggered at the step's
end, so with one the work stays on the training thread. A failure there (a full disk) is
raised on the training thread at the next step or at stop.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from opscope.monitor.detect import BandDetector, Key
from opscope.monitor.events import Departure, MonitorEvent
from opscope.monitor.series import Block, SeriesWriter


class Judge:
    """Runs :meth:`judge` for every step handed to :meth:`submit`, in order."""

    def __init__(self, detector: BandDetector, writer: SeriesWriter, rank: int,
                 emit: Callable[[MonitorEvent], None], threaded: bool) -> None:
        self.detector, self.writer, self.rank, self.emit = detector, writer, rank, emit
        self.order: dict[Key, int] = {}
        self.error: BaseException | None = None
        self._queue: queue.Queue[tuple[Any, ...] | None] = queue.Queue(maxsize=8)  # a slow disk holds training
        self._thread: threading.Thread | None = None
        if threaded:
            self._thread = threading.Thread(target=self._run, name="opscope-monitor-judge", daemon=True)
            self._thread.start()

    def submit(self, step: int, blocks: list[Block], scalars: dict[Key, float], causes: list[Departure],
               order: dict[Key, int] | None) -> None:
        """Hand over one step (``order``: the series' places, when they changed)."""
        self.check()
        item = (step, blocks, scalars, causes, order)
        if self._thread is None:
            self.judge(*item)
        else:
            self._queue.put(item)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self.error is None:
                try:
                    self.judge(*item)
                except BaseException as exc:  # raised on the training thread by check()
                    self.error = exc

    def judge(self, step: int, blocks: list[Block], scalars: dict[Key, float], causes: list[Departure],
              order: dict[Key, int] | None) -> None:
        """Detect, keep the rows, report the step's event."""
        if order is not None:
            self.order = order
            self.writer.order = {f"{kind}\t{name}": position for (kind, name), position in order.items()}
        keys = tuple(k for block_keys, _ in blocks for k in block_keys) + tuple(scalars)
        stats = np.concatenate([v for _, v in blocks]) if blocks else np.zeros((0, 4))
        raw = np.concatenate([stats[:, 0], np.fromiter(scalars.values(), np.float64, len(scalars))])
        bad = np.concatenate([stats[:, 2] + stats[:, 3], np.zeros(len(scalars))])
        event = self.detector.update(step, self.rank, keys, raw, bad, self.order)
        self.writer.add(step, blocks, scalars)
        if causes:
            event = event or MonitorEvent(step=step, rank=self.rank)
            event.departures = sorted(causes + event.departures, key=lambda d: (d.order, -d.z))
        if event is not None:
            self.emit(event)

    def check(self) -> None:
        """Raise what failed on the background thread."""
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def close(self) -> None:
        """Judge what is still queued; then raise what failed."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        self.check()
