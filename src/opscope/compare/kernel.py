"""The one-pass C kernel over a block of a tensor pair (``_pairsums``, built from
``_c/pairsums.c`` when opscope is installed where a C compiler is).

:func:`sums` returns None where the kernel is missing or a side's dtype is not one it reads
(float32, float64, bfloat16, float16); :mod:`opscope.compare.accumulate` then takes numpy's
chunked pass, which computes the same sums in about fifteen passes over each chunk.
:func:`stream` reads and sums a whole tensor pair block by block in C, without the GIL
(POSIX; None elsewhere, or where the extension predates it).
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


def _load() -> ModuleType | None:
    try:
        from opscope.compare import _pairsums
    except ImportError:  # built without a C compiler: numpy's pass is used
        return None
    return _pairsums


native = _load()

CODES = {"float32": (0, 4), "float64": (1, 8), "bfloat16": (2, 2), "float16": (3, 2)}
Sums = tuple[float, float, float, float, float, float, float, float, float, int]


def sums(a: np.ndarray, a_dtype: str, b: np.ndarray, b_dtype: str, rel_floor: float, rtol: float) -> Sums | None:
    """``(sum_sq_diff, sum_abs_diff, max_abs, dot, sum_sq_target, sum_sq_reference, max_rel,
    sum_rel, sum_sq_elem_rel, out_of_tolerance)`` of two equal-size contiguous blocks as
    stored (``a_dtype``: the opscope dtype, bfloat16 as its uint16 bits), or None."""
    ca, cb = CODES.get(a_dtype), CODES.get(b_dtype)
    if native is None or ca is None or cb is None or a.size != b.size:
        return None
    if a.itemsize != ca[1] or b.itemsize != cb[1] or not (a.flags.c_contiguous and b.flags.c_contiguous):
        return None
    result: Sums = native.sums(a.ctypes.data, ca[0], b.ctypes.data, cb[0], a.size, rel_floor, rtol)
    return result


def can_stream(a_dtype: str, b_dtype: str) -> bool:
    """Can :func:`stream` read and sum these two dtypes?"""
    return getattr(native, "stream", None) is not None and a_dtype in CODES and b_dtype in CODES


def stream(fd_a: int, offset_a: int, a_dtype: str, fd_b: int, offset_b: int, b_dtype: str, n: int, block: int,
           buf_a: np.ndarray, buf_b: np.ndarray, rel_floor: float, rtol: float) -> tuple[list[Sums], int]:
    """Read ``n`` elements of each side from byte ``offset_a`` of file ``fd_a`` and
    ``offset_b`` of ``fd_b``, ``block`` elements at a time into ``buf_a``/``buf_b``, and sum
    each block as :func:`sums` does. Stops early before a block whose sums are not finite or
    that a file ends inside (the caller reads that block itself: the masked pass, or the
    error naming the file). Returns each block's sums and the elements they cover.

    Raises:
        OSError: a read failed.
        ValueError: :func:`can_stream` is false, or a buffer is smaller than a block.
    """
    if native is None or not can_stream(a_dtype, b_dtype):
        raise ValueError(f"the C kernel cannot stream {a_dtype} against {b_dtype}")
    (ca, size_a), (cb, size_b) = CODES[a_dtype], CODES[b_dtype]
    for buf, size in ((buf_a, size_a), (buf_b, size_b)):
        if buf.nbytes < block * size or not (buf.flags.c_contiguous and buf.flags.writeable):
            raise ValueError(f"a buffer of {buf.nbytes} bytes cannot hold a block of {block} elements")
    blocks: list[Sums]
    done: int
    blocks, done, _ = native.stream(fd_a, offset_a, ca, fd_b, offset_b, cb, n, block, buf_a.ctypes.data,
                                    buf_b.ctypes.data, rel_floor, rtol)
    return blocks, done
