"""Background statistics for CPU tensors, safe against in-place updates.

The capture thread submits ``(row, tensor, data_key)`` jobs; one worker thread computes
the statistics in C with the GIL released (and copies the tensor for the writer when full
tensors are wanted), writing the results into the row. Before an op writes to a tensor,
the capture thread calls :meth:`StatsWorker.before_write` with its storage: it waits until
no pending job still reads that storage, so a statistic is never taken of a half-updated
tensor ("the same run twice" gives identical dumps).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from opscope.capture.torch.stats import cpu_stats
from opscope.model.records import COL, STATS

_DATA, _KEY = COL["data"], COL["key"]


class StatsWorker:
    """One worker thread with a bounded job queue.

    Args:
        store: called on the worker thread as ``store(row, tensor_copy) -> shard name``
            for jobs that want the full tensor.
        max_jobs: pending jobs before ``submit`` waits (bounds the memory they pin).
    """

    def __init__(self, store: Callable[[list[Any], torch.Tensor], str] | None, max_jobs: int = 256) -> None:
        self._store = store
        self._max = max_jobs
        self._jobs: deque[tuple[list[Any], torch.Tensor, bool, int]] = deque()
        self._pending: dict[int, int] = {}
        self._cond = threading.Condition()
        self._closed = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="opscope-stats", daemon=True)
        self._thread.start()

    def submit(self, row: list[Any], tensor: torch.Tensor, want_data: bool) -> None:
        ptr = _storage_ptr(tensor)
        with self._cond:
            while len(self._jobs) >= self._max and self.error is None:
                self._cond.wait()
            self._jobs.append((row, tensor, want_data, ptr))
            self._pending[ptr] = self._pending.get(ptr, 0) + 1
            self._cond.notify_all()

    def before_write(self, tensor: torch.Tensor) -> None:
        """Block until no pending job reads the storage of ``tensor``."""
        if not self._pending:
            return
        ptr = _storage_ptr(tensor)
        if ptr in self._pending:
            with self._cond:
                while self._pending.get(ptr) and self.error is None:
                    self._cond.wait()

    def drain(self) -> None:
        """Wait until every submitted job is done; re-raise a worker error."""
        with self._cond:
            while (self._jobs or self._pending) and self.error is None:
                self._cond.wait()
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if not self._jobs:
                    return
                row, tensor, want_data, ptr = self._jobs.popleft()
            try:
                if self.error is None:
                    self._run(row, tensor, want_data)
            except BaseException as exc:  # surfaced on the capture thread by drain()
                self.error = exc
            with self._cond:
                left = self._pending[ptr] - 1
                if left:
                    self._pending[ptr] = left
                else:
                    del self._pending[ptr]
                self._cond.notify_all()

    def _run(self, row: list[Any], tensor: torch.Tensor, want_data: bool) -> None:
        row[STATS] = cpu_stats(tensor)
        if want_data and self._store is not None:
            row[_DATA] = self._store(row, tensor.detach().clone(memory_format=torch.contiguous_format))


def _storage_ptr(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # tensors without storage (sparse, functional wrappers)
        return id(t)


def tensor_buffer(t: torch.Tensor) -> tuple[str, list[int], Any, int]:
    """``(dtype name, shape, raw little-endian buffer, nbytes)`` of a contiguous CPU tensor."""
    from opscope.capture.torch.stats import dtype_name

    dtype = dtype_name(t.dtype)
    if t.is_complex():
        t = torch.view_as_real(t)
        dtype = "float32" if dtype == "complex64" else "float64"
    if t.dtype == torch.bfloat16 or t.dtype == torch.float16:
        raw = t.view(torch.int16).numpy()
    elif t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raw = t.view(torch.uint8).numpy()
    else:
        raw = t.numpy()
    return dtype, list(t.shape), raw, raw.nbytes
