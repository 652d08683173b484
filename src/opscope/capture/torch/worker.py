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
from collections.abc import Callable
from typing import Any

import torch

from opscope.capture.torch.stats import CODES, _fastats, cpu_stats
from opscope.model.records import COL, STATS

_DATA, _KEY = COL["data"], COL["key"]


class StatsWorker:
    """One worker thread reducing submitted tensors in batches.

    Jobs are handed over in batches of ``batch`` so that the worker takes the GIL once per
    batch, not once per tensor (each hand-over of the GIL costs the training thread a
    context switch); the C kernel then runs the whole batch with the GIL released.

    Args:
        store: called on the worker thread as ``store(row, tensor_copy) -> shard name``
            for jobs that want the full tensor.
        max_jobs: pending jobs before ``submit`` waits (bounds the memory they pin).
        batch: jobs collected before the worker is woken.
    """

    def __init__(self, store: Callable[[list[Any], torch.Tensor], str] | None, max_jobs: int = 1024,
                 batch: int = 64) -> None:
        self._store = store
        self._max = max_jobs
        self._batch = batch
        self._jobs: list[list[Any]] = []  # [row, tensor, want_data, storage, spec, taken]
        self._queued: dict[int, list[list[Any]]] = {}
        self._pending: dict[int, int] = {}
        self._cond = threading.Condition()
        self._urgent = False
        self._closed = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="opscope-stats", daemon=True)
        self._thread.start()

    def submit(self, row: list[Any], tensor: torch.Tensor, want_data: bool) -> None:
        ptr = _storage_ptr(tensor)
        job = [row, tensor, want_data, ptr, fast_spec(tensor), False]
        with self._cond:
            if len(self._jobs) >= self._max:
                self._urgent = True
                self._cond.notify_all()
                while len(self._jobs) >= self._max and self.error is None:
                    self._cond.wait()
            self._jobs.append(job)
            self._queued.setdefault(ptr, []).append(job)
            self._pending[ptr] = self._pending.get(ptr, 0) + 1
            if len(self._jobs) >= self._batch:
                self._cond.notify_all()

    def before_write(self, tensor: torch.Tensor) -> None:
        """Make sure no pending job will read ``tensor``'s storage after it is written.

        Jobs still queued are taken over and run here at once (cheaper than waking the
        worker); a job the worker is running is waited for.
        """
        if not self._pending:
            return
        ptr = _storage_ptr(tensor)
        if ptr not in self._pending:
            return
        with self._cond:
            mine = [j for j in self._queued.pop(ptr, ()) if not j[5]]
            for job in mine:
                job[5] = True
        if mine:
            self._run(mine)
            self._finished(mine)
        if self._pending.get(ptr):
            self._wait(lambda: not self._pending.get(ptr))

    def drain(self) -> None:
        """Wait until every submitted job is done; re-raise a worker error."""
        self._wait(lambda: not self._jobs and not self._pending)
        if self.error is not None:
            raise self.error

    def _wait(self, done: Callable[[], bool]) -> None:
        with self._cond:
            self._urgent = True
            self._cond.notify_all()
            while not done() and self.error is None:
                self._cond.wait()
            self._urgent = False

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while len(self._jobs) < self._batch and not self._urgent and not self._closed:
                    self._cond.wait()
                if not self._jobs and self._closed:
                    return
                jobs = [j for j in self._jobs if not j[5]]
                for job in jobs:
                    job[5] = True
                self._jobs, self._queued = [], {}
                self._cond.notify_all()
            try:
                if self.error is None and jobs:
                    self._run(jobs)
            except BaseException as exc:  # surfaced on the capture thread by drain()
                self.error = exc
            self._finished(jobs)

    def _finished(self, jobs: list[list[Any]]) -> None:
        with self._cond:
            for job in jobs:
                left = self._pending[job[3]] - 1
                if left:
                    self._pending[job[3]] = left
                else:
                    del self._pending[job[3]]
            self._cond.notify_all()

    def _run(self, jobs: list[list[Any]]) -> None:
        fast = [j for j in jobs if j[4] is not None]
        if fast:
            for job, stats in zip(fast, _fastats.stats_batch([j[4] for j in fast]), strict=True):
                job[0][STATS] = stats
        for row, tensor, want_data, _, spec, _ in jobs:
            if spec is None:
                row[STATS] = cpu_stats(tensor)
            if want_data and self._store is not None:
                row[_DATA] = self._store(row, tensor.detach().clone(memory_format=torch.contiguous_format))


def fast_spec(t: torch.Tensor) -> tuple[int, int, int] | None:
    """``(address, numel, dtype code)`` when the C batch kernel can read ``t`` directly."""
    code = CODES.get(t.dtype)
    if code is None or code == 2 or _fastats is None or not t.is_contiguous():
        return None
    return (t.data_ptr(), t.numel(), code)


def _storage_ptr(t: torch.Tensor) -> int:
    try:  # cheaper than untyped_storage().data_ptr(), which builds a storage object
        return t.data_ptr() - t.storage_offset() * t.element_size()
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
