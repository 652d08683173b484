"""Statistics and content hash of numpy arrays, as the dump format defines them. No torch.

Shared by every writer of records from numpy arrays: the ONNX Runtime capture, and readers
of other tools' dumps (a MindSpore Data Dump's ``.npy`` files).

Every statistic is computed in float64, over cache-sized chunks so a large tensor never
needs a full float64 copy:

- ``min``, ``max``, ``mean``, ``std`` (population, ``ddof=0``), ``norm`` (L2), ``absmax``:
  NaN propagates as in numpy (a tensor holding one NaN has ``min`` = ``max`` = NaN);
  an Inf shows as ``max=inf`` / ``absmax=inf``. ``None`` for an empty tensor.
- ``nan``, ``inf``, ``zeros``: element counts.
- ``hash`` (``wsum64-v2``): see :mod:`opscope.model.hashing`, the reference definition
  shared with the PyTorch capture.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from opscope.model.hashing import content_hash

CHUNK = 1 << 16  # elements per pass; float64 chunks stay in L2


# numpy dtype name -> opscope (torch-style) dtype name
_NUMPY_NAMES = {
    "float64": "float64", "float32": "float32", "float16": "float16", "bfloat16": "bfloat16",
    "int64": "int64", "int32": "int32", "int16": "int16", "int8": "int8",
    "uint64": "uint64", "uint32": "uint32", "uint16": "uint16", "uint8": "uint8",
    "bool": "bool", "complex64": "complex64", "complex128": "complex128",
    "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
}


def dtype_name(arr: np.ndarray) -> str:
    """The torch-style dtype name of an array (``float32``, ``bool``...); ``object`` for strings."""
    return _NUMPY_NAMES.get(arr.dtype.name, "object" if arr.dtype.kind in "OUS" else arr.dtype.name)


def _as_float64(chunk: np.ndarray) -> np.ndarray:
    if chunk.dtype.name == "bfloat16":  # ml_dtypes.bfloat16, as onnxruntime returns it
        return (chunk.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return chunk.astype(np.float64)


def finish(mn: float, mx: float, total: float, sumsq: float, nan: int, inf: int, zeros: int,
           hash_: int, n: int, m2: float | None = None) -> tuple[Any, ...]:
    """The C kernel's raw sums (the PyTorch and TensorFlow captures') as the stored statistics,
    STAT_NAMES order. ``m2``: the squared deviations from the mean, as the kernel gives them
    (fastats_spread.h); without it they are taken from the sums, which holds for the float64
    sums of the device reductions (the native device path's arithmetic, the same bits)."""
    if n == 0:
        return (None, None, None, None, 0.0, None, 0, 0, 0, hash_)
    if nan:
        return (math.nan,) * 6 + (nan, inf, zeros, hash_)
    mean = total / n
    if m2 is None:
        m2 = sumsq - total * total / n
    var = m2 / n if math.isfinite(sumsq) else math.nan
    std = math.sqrt(var) if var > 0 else (0.0 if var == var else math.nan)
    return (mn, mx, mean, std, math.sqrt(sumsq), max(abs(mn), abs(mx)), nan, inf, zeros, hash_)


def tensor_stats(arr: np.ndarray) -> tuple[Any, ...]:
    """``(min, max, mean, std, norm, absmax, nan, inf, zeros, hash)`` of ``arr``.

    Strings and other non-numeric arrays get ``None`` everywhere but the counts (0).
    """
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN by definition here
        return _tensor_stats(arr)


def _tensor_stats(arr: np.ndarray) -> tuple[Any, ...]:
    if arr.dtype.kind in "OUSV" and arr.dtype.name != "bfloat16":
        return (None,) * 6 + (0, 0, 0, None)
    if arr.dtype.kind == "c":
        arr = np.ascontiguousarray(arr).view(arr.real.dtype)
    flat = np.ascontiguousarray(arr).reshape(-1)
    n = flat.size
    if n == 0:
        return (None, None, None, None, 0.0, None, 0, 0, 0, 0)
    lo, hi, total, squares, nan, inf, zeros = math.inf, -math.inf, 0.0, 0.0, 0, 0, 0
    saw_nan = False
    for start in range(0, n, CHUNK):
        x = _as_float64(flat[start:start + CHUNK])
        isnan = np.isnan(x)
        chunk_nan = int(isnan.sum())
        saw_nan = saw_nan or chunk_nan > 0
        nan += chunk_nan
        inf += int(np.isinf(x).sum())
        zeros += int((x == 0).sum())
        if not saw_nan:
            lo, hi = min(lo, float(x.min())), max(hi, float(x.max()))
        total += float(x.sum())
        squares += _sum_of_squares(x)
    mean = total / n
    if saw_nan:
        lo = hi = mean = std = norm = absmax = math.nan
    else:
        std = _std(flat, mean)
        norm = math.sqrt(squares)
        absmax = max(abs(lo), abs(hi))
    return (lo, hi, mean, std, norm, absmax, nan, inf, zeros, content_hash(arr))


def _std(flat: np.ndarray, mean: float) -> float:
    """Population standard deviation, two-pass (numerically stable), chunked."""
    if not math.isfinite(mean):
        return math.nan
    acc = 0.0
    for start in range(0, flat.size, CHUNK):
        d = _as_float64(flat[start:start + CHUNK]) - mean
        acc += _sum_of_squares(d)
    return math.sqrt(acc / flat.size)


def _sum_of_squares(x: np.ndarray) -> float:
    """Σx² of one chunk by numpy's pairwise sum, not a BLAS dot: on 64K-element chunks BLAS
    threads only oversubscribe the cores (3.5x slower reading a MindSpore dump on 2 busy cores)."""
    return float((x * x).sum())
