"""The one-pass C kernel over a block of a tensor pair (``_pairsums``, built from
``_c/pairsums.c`` when opscope is installed where a C compiler is).

:func:`sums` returns None where the kernel is missing or a side's dtype is not one it reads
(float32, float64, bfloat16, float16); :mod:`opscope.compare.metrics` then takes numpy's
chunked pass, which computes the same sums in about fifteen passes over each chunk.
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
