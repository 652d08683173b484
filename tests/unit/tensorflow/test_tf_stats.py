"""``many_stats``: a graph run's arrays in one call of the C kernel, the same statistics as
one call per array (``host_stats``) and as numpy's (``tensor_stats``) where the kernel
does not take an array."""

from __future__ import annotations

import math

import numpy as np
import pytest

from opscope.capture.tensorflow import stats as st
from opscope.model.tensor_stats import tensor_stats

kernel = st._fastats
needs_kernel = pytest.mark.skipif(kernel is None or not hasattr(kernel, "stats_many"),
                                  reason="the C kernel is not built")


def _same(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))
                                    for x, y in zip(a, b, strict=True))


def _arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    big = rng.standard_normal(70_000).astype(np.float32)  # above the worker's 64 KB
    nan = rng.standard_normal(300).astype(np.float32)
    nan[7] = np.nan
    inf = np.array([1.0, np.inf, -2.0], dtype=np.float64)
    readonly = rng.standard_normal(5_000).astype(np.float32)
    readonly.flags.writeable = False
    arrays = [big, nan, inf, readonly, np.zeros(0, np.float32), np.float32(2.5),
              rng.integers(-5, 5, 1_000).astype(np.int8), rng.standard_normal(40_000),
              np.arange(12, dtype=np.int64), np.array([True, False, True]),
              rng.standard_normal((8, 8)).astype(np.float32)[:, ::2],  # not contiguous: numpy
              (rng.standard_normal(6) + 1j).astype(np.complex64),  # no kernel code: numpy
              big[::-1].copy(), rng.standard_normal(200_000).astype(np.float32)]
    ml_dtypes = pytest.importorskip("ml_dtypes")
    return [*arrays, rng.standard_normal(3_000).astype(ml_dtypes.bfloat16)]


@needs_kernel
@pytest.mark.parametrize("worker_free", [True, False])
def test_one_call_gives_each_arrays_own_statistics(worker_free: bool) -> None:
    arrays = [np.asarray(a) for a in _arrays()]
    if not worker_free:
        st._QUEUE.acquire()  # another caller has the worker: all reduced on this thread
    try:
        got = st.many_stats(arrays)
    finally:
        if not worker_free:
            st._QUEUE.release()
    assert len(got) == len(arrays)
    for arr, stats in zip(arrays, got, strict=True):
        assert _same(stats, st.host_stats(arr)), (arr.dtype, arr.shape)
        if arr.size:
            assert stats[6] == int(np.isnan(arr).sum()) if arr.dtype.kind in "fc" else stats[6] == 0
    assert math.isnan(got[1][0]) and got[1][6] == 1
    assert got[2][7] == 1 and math.isnan(got[2][3])  # an Inf: no std
    assert _same(got[10], tensor_stats(arrays[10]))
    assert got[0][9] != got[12][9], "the hash must see the order of the elements"


@needs_kernel
def test_the_worker_queue_is_left_empty_for_the_next_caller() -> None:
    arrays = [np.full(40_000, float(i), np.float32) for i in range(6)]
    first = st.many_stats(arrays)
    job = kernel.submit(arrays[0].ctypes.data, arrays[0].size, 0)
    assert job == 0, "ids start again at 0: the queue was reset"
    kernel.wait(job)
    assert _same(kernel.results(job, job + 1)[0], first[0])
    kernel.reset()


@needs_kernel
def test_bad_calls_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="one code per array"):
        kernel.stats_many([np.zeros(3, np.float32)], b"")
    with pytest.raises(TypeError, match="must be a sequence"):
        kernel.stats_many(3, b"")
    assert kernel.stats_many([b"abc", object()], bytes([5, 0])) == [
        kernel.stats_many([np.frombuffer(b"abc", np.uint8)], bytes([5]))[0], None]
