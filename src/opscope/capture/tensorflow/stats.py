"""Statistics of TensorFlow tensors on the host, as the dump format defines them.

A CPU tensor's buffer is read in place (``EagerTensor._numpy()`` shares it) by opscope's
one-pass C kernel (``_fastats``: min, max, sum, sum of squares, NaN/Inf/zero counts and the
``wsum64-v2`` hash together); without it, numpy (:mod:`opscope.capture.onnxruntime.stats`).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from opscope.model.tensor_stats import dtype_name, finish, tensor_stats


class Measured(NamedTuple):
    """Values' statistics as columns (:func:`opscope.capture.tensorflow.stats.many_columns`),
    their shapes and dtype names."""

    stats: np.ndarray  # (10, n): STAT_NAMES, rows 6-9 uint64 bits
    nulls: np.ndarray | None  # (10, n) bool: None statistics
    shapes: Sequence[tuple[int, ...] | None]  # None: an absent value whose shape was not known
    dtypes: list[str]
    absent: np.ndarray | None = None  # the values the graph that ran did not have (absent.py)


def _load_kernel() -> Any:
    """The C kernel: a plain C extension built with opscope (importing it loads no torch)."""
    import importlib

    for name in ("opscope.capture.torch.native._fastats", "opscope.capture.torch._fastats"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None  # a source checkout without the build: numpy


_fastats = _load_kernel()
if _fastats is not None and (getattr(_fastats, "HASH", "") != "wsum64-v2" or getattr(_fastats, "SPREAD", 0) < 1):
    _fastats = None  # a stale build computes another hash or std: never record a wrong one

CODES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3, "int8": 4, "uint8": 5,
         "int16": 6, "int32": 7, "int64": 8, "bool": 9}
if _fastats is None or not getattr(_fastats, "SIMD", 0):
    CODES.pop("float16")  # the portable C loop over float16 is slower than numpy
BACKEND = "host-c" if _fastats is not None else "numpy"
NUMERIC = frozenset(CODES) | {"float16", "uint16", "uint32", "uint64", "complex64", "complex128"}


def array_of(tensor: Any) -> np.ndarray:
    """The host array of an eager tensor, sharing a CPU tensor's buffer (no copy)."""
    internal = getattr(tensor, "_numpy", None)
    arr = internal() if internal is not None else tensor.numpy()
    return np.asarray(arr)


_BYTE = ctypes.c_char


def address(arr: np.ndarray) -> int:
    """The address of a C-contiguous array's first byte. Through the buffer protocol where
    the array is writable (~0.4 us; ``arr.ctypes.data`` builds an object for it, ~1-2 us,
    and a graph run hands over ~1,100 arrays); nothing is written through it."""
    try:
        return ctypes.addressof(_BYTE.from_buffer(arr))  # type: ignore[arg-type]  # ndarray exports a buffer; its stubs do not say so
    except (TypeError, ValueError, BufferError):  # read-only, or empty
        return int(arr.ctypes.data)


def host_stats(arr: np.ndarray) -> tuple[Any, ...]:
    """``(min, max, mean, std, norm, absmax, nan, inf, zeros, hash)`` of ``arr``."""
    code = CODES.get(name_of(arr)) if _fastats is not None else None
    if code is None or not arr.flags.c_contiguous:
        return tensor_stats(arr)
    n = int(arr.size)
    mn, mx, total, sumsq, nan, inf, zeros, h, m2 = _fastats.stats(address(arr), n, code)
    return finish(mn, mx, total, sumsq, nan, inf, zeros, h, n, m2)


_QUEUE = threading.Lock()  # the kernel's worker queue serves one caller at a time
_CODE_OF: dict[Any, int] = {}
_NONE = 255  # not a code of the kernel: the array is measured by numpy


def _code(arr: np.ndarray) -> int:
    code = _CODE_OF.get(arr.dtype)
    if code is None:
        code = _CODE_OF[arr.dtype] = CODES.get(name_of(arr), _NONE)
    return code


def many_stats(arrays: list[np.ndarray]) -> list[tuple[Any, ...]]:
    """Statistics of many arrays in one call of the C kernel (a graph run hands over ~1,000),
    on two cores: arrays of 64 KB or more on the kernel's worker thread while this thread
    reduces the rest. Arrays the kernel does not take
    (another dtype, not C-contiguous) are measured by numpy."""
    if _fastats is None or not hasattr(_fastats, "stats_many"):
        return [host_stats(a) for a in arrays]
    codes = bytes(map(_code, arrays))
    worker = _QUEUE.acquire(blocking=False)
    try:
        got = _fastats.stats_many(arrays, codes, worker)
    finally:
        if worker:
            _QUEUE.release()
    return [tensor_stats(a) if s is None else s for a, s in zip(arrays, got, strict=True)]


_MASK64 = 0xFFFFFFFFFFFFFFFF


def many_columns(arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray | None]:
    """The statistics of many arrays as columns, as :func:`many_stats` measures them:
    ``(stats, nulls)``, ``stats`` a ``(10, len(arrays))`` float64 array whose rows are the
    statistics in ``STAT_NAMES`` order (rows 6-9 hold the uint64 counts and hash: view them
    so), ``nulls`` marks the statistics that are None (None where there is none). The kernel
    writes the columns itself: no Python object per array or statistic."""
    out = np.empty((10, len(arrays)), np.float64)
    missing: Any = range(len(arrays))
    if _fastats is not None and hasattr(_fastats, "stats_many"):
        codes = bytes(map(_code, arrays))
        worker = _QUEUE.acquire(blocking=False)
        try:
            missing = _fastats.stats_many(arrays, codes, worker, out)
        finally:
            if worker:
                _QUEUE.release()
    nulls = None
    counts = out[6:].view(np.uint64)
    for i in missing:  # the kernel's dtypes left out, empty arrays (None statistics), no kernel
        for k, v in enumerate(host_stats(arrays[i])):
            if v is None:
                nulls = np.zeros(out.shape, bool) if nulls is None else nulls
                nulls[k, i], v = True, 0
            if k < 6:
                out[k, i] = v
            else:
                counts[k - 6, i] = v & _MASK64
    return out, nulls


_NAMES: dict[Any, str] = {}


def name_of(arr: np.ndarray) -> str:
    """``dtype_name`` of an array, cached by dtype (numpy's ``dtype.name`` is slow)."""
    name = _NAMES.get(arr.dtype)
    if name is None:
        name = _NAMES[arr.dtype] = dtype_name(arr)
    return name


def stored_buffer(arr: np.ndarray) -> tuple[str, list[int], np.ndarray]:
    """``(dtype name, shape, contiguous little-endian buffer)`` for the safetensors writer."""
    name = name_of(arr)
    buf = np.ascontiguousarray(arr)
    if name == "bfloat16":
        buf = buf.view(np.uint16)
    return name, [int(d) for d in arr.shape], buf


__all__ = ["BACKEND", "CODES", "NUMERIC", "array_of", "dtype_name", "finish", "host_stats", "many_columns",
           "stored_buffer"]
