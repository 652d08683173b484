"""Statistics on a native thread, safe against in-place updates.

The capture thread submits ``(row, tensor)``; the C extension's own thread (no GIL, no
Python) reduces each tensor in one pass while the step goes on. The capture thread pays
~1 µs per tensor. Results are collected in order and written into the rows; tensors are
released as soon as their result is collected. Before an op writes to a tensor in place,
the capture thread calls :meth:`NativeStats.before_write`, which reduces the pending jobs
on that storage right away (or waits for the one running), so a statistic is never taken of a
half-updated tensor ("the same run twice" gives identical dumps).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from opscope.capture.torch.stats import CODES, F16_FAST, FastStats, _fastats, cpu_stats
from opscope.model.records import COL, STATS

_DATA = COL["data"]
_OWNER = threading.Lock()  # the native queue serves one capture at a time
# Bytes of tensors the pending jobs keep alive, at most: past it their results are collected, and
# the capture thread waits for the oldest where they are not done yet. Without it a step of
# large tensors kept up to collect_every of them alive (256 activations of 16 MB: 4 GB).
HELD_BYTES = 64 << 20


class NativeStats:
    """Feeds the C extension's worker thread and collects its results into rows.

    Args:
        store: ``store(row, tensor_copy) -> shard name`` for rows that want full tensors.
        collect_every: pending jobs after which finished results are collected (bounds the
            number of tensors kept alive).
    """

    def __init__(self, store: Callable[[list[Any], torch.Tensor], str] | None, collect_every: int = 256,
                 publish: Callable[[list[Any], Any], str | None] | None = None) -> None:
        if _fastats is None or not _OWNER.acquire(blocking=False):
            raise RuntimeError("the native statistics thread is not available")
        self._kernel: FastStats = _fastats
        self._store = store
        self._publish = publish  # publish(row, bytes copied by the native thread) -> shard name
        self._every = collect_every
        self._jobs: list[tuple[list[Any], Any, Any, int] | None] = []  # row, storage, buffer, bytes
        self._held = 0  # bytes of the storages the pending jobs hold
        self._collected = 0
        self._last: dict[int, list[int]] = {}  # storage -> jobs still reading it

    def submit(self, row: list[Any], tensor: torch.Tensor, want_data: bool) -> None:
        """Queue the statistics of a CPU tensor with strided layout."""
        code = CODES.get(tensor.dtype)
        fast = code is not None and (code != 2 or F16_FAST) and tensor.is_contiguous()
        if want_data and (not fast or self._publish is None) and self._store is not None:
            tensor = tensor.detach().clone(memory_format=torch.contiguous_format)  # a stable copy
            row[_DATA] = self._store(row, tensor)
            want_data = False
        if not fast or code is None:
            row[STATS] = cpu_stats(tensor)
            return
        ptr, numel = tensor.data_ptr(), tensor.numel()
        # full tensors: the native thread copies the bytes out in the same pass, off this thread
        buffer = np.empty(numel * tensor.element_size(), dtype=np.uint8) if want_data else None
        job = self._kernel.submit(ptr, numel, code, 0 if buffer is None else buffer.ctypes.data)
        # Keep the memory alive through its storage, not the tensor: an extra reference to
        # the tensor would change what autograd does (AccumulateGrad steals a gradient
        # only when nothing else holds it) and so the ops of the run being observed.
        nbytes = numel * tensor.element_size()
        self._jobs.append((row, tensor.untyped_storage(), buffer, nbytes))
        self._held += nbytes
        # an eager tensor's offset is an int (torch's stub also allows a SymInt, for tracing)
        storage: int = ptr - tensor.storage_offset() * tensor.element_size()  # type: ignore[assignment]
        pending = self._last.get(storage)
        if pending is None:
            self._last[storage] = [job]
        else:
            pending.append(job)
        if job - self._collected >= self._every or self._held >= HELD_BYTES:
            self.poll()
            while self._held >= HELD_BYTES and self._collected <= job:  # the thread is behind: wait for it
                self._kernel.wait(self._collected)
                self.poll()

    def before_write(self, tensor: torch.Tensor) -> None:
        """Make sure no pending job will read the storage of ``tensor`` once it is written:
        jobs not started yet are reduced right here, a running one is waited for."""
        if self._last:
            jobs = self._last.pop(_storage_ptr(tensor), None)
            if jobs:
                for job in jobs:
                    if job >= self._collected:
                        self._kernel.take(job)

    def poll(self) -> None:
        """Collect every finished result into its row and let go of its tensor."""
        kernel, publish = self._kernel, self._publish
        done = kernel.done()
        if done > self._collected:
            for i, stats in enumerate(kernel.results(self._collected, done), self._collected):
                job = self._jobs[i]
                assert job is not None, "a job is collected once"
                row, _, buffer, nbytes = job
                self._jobs[i] = None
                self._held -= nbytes
                self._collected = i + 1  # even if publishing below raises, this job is done
                row[STATS] = stats
                if buffer is not None and publish is not None:  # a buffer is made for publish only
                    row[_DATA] = publish(row, buffer)

    def drain(self) -> None:
        """Finish and collect every job; the queue starts empty again."""
        if self._jobs:
            self._kernel.wait(len(self._jobs) - 1)
            self.poll()
        self._kernel.reset()
        self._jobs, self._collected, self._last, self._held = [], 0, {}, 0

    def close(self) -> None:
        try:
            self.drain()
        finally:
            _OWNER.release()


def _storage_ptr(t: torch.Tensor) -> int:
    try:  # cheaper than untyped_storage().data_ptr(), which builds a storage object
        # an eager tensor's offset is an int (torch's stub also allows a SymInt, for tracing)
        return t.data_ptr() - t.storage_offset() * t.element_size()  # type: ignore[return-value]
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
