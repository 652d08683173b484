"""Statistics and the wsum64-v2 hash of captured ONNX tensors equal numpy's definitions."""

from __future__ import annotations

import numpy as np
import pytest

from opscope.capture.onnxruntime import stats as st


def _hash_reference(arr: np.ndarray) -> int:
    """wsum64-v2 written out word by word in Python ints (docs/format.md), to hold the fast one to."""
    raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8).tobytes()
    raw += bytes(-len(raw) % 4)
    h1 = h2 = 0
    for i in range(len(raw) // 4):
        salt = i * 0x9E3779B9 % (1 << 32)
        x = int.from_bytes(raw[4 * i:4 * i + 4], "little") ^ salt
        x ^= x >> 16
        x = x * 0x7FEB352D % (1 << 32)
        x ^= x >> 15
        x = x * 0x846CA68B % (1 << 32)
        x ^= x >> 16
        h1, h2 = (h1 + (x ^ salt)) % (1 << 32), (h2 + x) % (1 << 32)
    return (h1 << 32) | h2


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int64, np.int32, np.uint8, np.bool_])
def test_hash_matches_the_definition(dtype):
    rng = np.random.default_rng(1)
    arr = (rng.standard_normal((3, 7)) * 50).astype(dtype)  # 21 elements: a padded last word
    assert st.content_hash(arr) == _hash_reference(arr)


def test_hash_spans_chunks_and_sees_order():
    arr = np.arange(st.CHUNK * 2 + 5, dtype=np.float32)
    assert st.content_hash(arr) == _hash_reference(arr)
    assert st.content_hash(arr[::-1].copy()) != st.content_hash(arr)


def test_stats_equal_numpy_in_float64():
    x = np.random.default_rng(0).standard_normal((4, 5000)).astype(np.float32)
    x[0, :10] = 0
    lo, hi, mean, std, norm, absmax, nan, inf, zeros, _ = st.tensor_stats(x)
    x64 = x.astype(np.float64)
    assert (lo, hi) == (x64.min(), x64.max())
    assert mean == pytest.approx(x64.mean(), rel=1e-12)
    assert std == pytest.approx(x64.std(), rel=1e-12)
    assert norm == pytest.approx(np.linalg.norm(x64), rel=1e-12)
    assert absmax == np.abs(x64).max()
    assert (nan, inf, zeros) == (0, 0, int((x == 0).sum()))


def test_nan_and_inf_are_counted_and_propagate():
    x = np.array([1.0, np.inf, np.nan, 0.0], dtype=np.float16)
    lo, hi, mean, std, norm, absmax, nan, inf, zeros, _ = st.tensor_stats(x)
    assert np.isnan(lo) and np.isnan(mean) and (nan, inf, zeros) == (1, 1, 1)
    y = np.array([1.0, np.inf], dtype=np.float16)
    assert st.tensor_stats(y)[1] == np.inf and st.tensor_stats(y)[5] == np.inf


def test_empty_and_dtype_names():
    assert st.tensor_stats(np.zeros((0, 3), np.float32))[:2] == (None, None)
    assert st.dtype_name(np.zeros(1, np.float32)) == "float32"
    assert st.dtype_name(np.zeros(1, np.bool_)) == "bool"
