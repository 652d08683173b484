"""Each finished step judged and written, off the training thread.

The training thread reads a step's statistics (the passes over the tensors must see them
alive) and hands them over; a background thread runs the detector, keeps the rows for the
Parquet writer and reports events. Steps are handed over in groups (``HANDOFF`` steps, what
``LATENCY`` seconds gathered, or the rest of a Parquet chunk): waking the thread costs the training thread a
handover of the GIL each time, which per step was a third of the monitor's cost on a
small model; an event is then reported up to that many steps (or seconds) after its step.
A flight recorder has to be triggered at the step's end, so with one the work stays on the
training thread. A failure there (a full disk) is raised on the training thread at a later
step or at stop.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from opscope.monitor.detect import BandDetector
from opscope.monitor.events import Departure, MonitorEvent
from opscope.monitor.series import Block, SeriesWriter, as_array
from opscope.monitor.tensorboard import ScalarWriter

HANDOFF = 16  # steps handed to the background thread at once
LATENCY = 0.5  # seconds: or fewer steps, when they took that long
QUEUED = 4  # groups handed over and not judged yet, at most: a slow disk holds training


class Judge:
    """Runs :meth:`judge` for every step handed to :meth:`submit`, in order."""

    def __init__(self, detector: BandDetector, writer: SeriesWriter, rank: int,
                 emit: Callable[[MonitorEvent], None], threaded: bool, tensorboard: ScalarWriter | None = None) -> None:
        self.detector, self.writer, self.rank, self.emit = detector, writer, rank, emit
        self.tensorboard = tensorboard
        self.error: BaseException | None = None
        # two C queues (a queue.Queue holds four locks and conditions, ~3 KB): the groups, and
        # QUEUED tokens of room, one taken per group handed over and given back once it is judged
        self._queue: queue.SimpleQueue[list[tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._room: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(QUEUED):
            self._room.put(None)
        self._thread: threading.Thread | None = None
        self._held: list[tuple[Any, ...]] = []
        self._since = time.monotonic()
        self._count = 0
        if threaded:
            self._thread = threading.Thread(target=self._run, name="opscope-monitor-judge", daemon=True)
            self._thread.start()

    def submit(self, step: int, blocks: list[Block], scalars: dict[int, float], causes: list[Departure]) -> None:
        """Hand over one step: blocks of series ids and their statistics, the scalars by id."""
        item = (step, blocks, scalars, causes)
        if self._thread is None:
            self.check()
            self.judge(*item)
            return
        self._held.append(item)
        self._count += 1
        # also at each chunk's last step, so that a crash loses no more than the steps since the last chunk
        chunk_done = self._count % self.writer.chunk == 0
        if len(self._held) >= HANDOFF or chunk_done or time.monotonic() - self._since > LATENCY:
            self._hand_over()

    def hand_over(self, least: int = 1) -> None:
        """Hand the steps held so far to the thread now, if there are ``least`` and it has room
        (else they wait): the training thread is about to leave the GIL free for a while (a
        backward pass), so the thread's Python makes it wait for nothing."""
        if self._thread is not None and len(self._held) >= least and self.error is None:
            try:
                self._room.get_nowait()
            except queue.Empty:
                return
            self._hand_over(room=False)

    def _hand_over(self, room: bool = True) -> None:
        self.check()
        held, self._held = self._held, []
        self._since = time.monotonic()
        if held:
            if room:
                self._room.get()
            self._queue.put(held)

    def _run(self) -> None:
        while True:
            items = self._queue.get()
            if items is None:
                return
            for item in items:
                if self.error is None:
                    try:
                        self.judge(*item)
                    except BaseException as exc:  # raised on the training thread by check()
                        self.error = exc
            self._room.put(None)

    def judge(self, step: int, blocks: list[Block], scalars: dict[int, float], causes: list[Departure]) -> None:
        """Detect, keep the rows, report the step's event."""
        blocks = [(i, as_array(v)) for i, v in blocks]  # (the gradients' come as bytes: stats.Running)
        ids = np.concatenate([*(i for i, _ in blocks), np.fromiter(scalars, np.int64, len(scalars))])
        stats = np.concatenate([v for _, v in blocks]) if blocks else np.zeros((0, 4))
        raw = np.concatenate([stats[:, 0], np.fromiter(scalars.values(), np.float64, len(scalars))])
        bad = np.concatenate([stats[:, 2] + stats[:, 3], np.zeros(len(scalars))])
        event = self.detector.update(step, self.rank, ids, raw, bad)
        self.writer.add(step, blocks, scalars)
        if self.tensorboard is not None:
            self.tensorboard.add(step, blocks, scalars)
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
            held, self._held = self._held, []
            if held:
                self._queue.put(held)  # no room taken: the thread ends after it
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        if self.tensorboard is not None:
            self.tensorboard.close()
        self.check()
