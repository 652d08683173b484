"""The noise model: how much two sides may differ because of their number formats.

A pair is judged in the precision of the *lower* of its two sides (fp32 vs bf16 is judged
as bf16), and an operator is judged against the error its inputs already carry
(:mod:`opscope.compare.verdict`). Everything here is plain numbers: no arrays, no logging.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Unit roundoff (machine epsilon) of each format; "tf32" is float32 storage with a 10-bit
# mantissa in matmuls (give precision="tf32" to compare() when the target ran with it).
EPSILON: dict[str, float] = {
    "float64": 2.0**-52,
    "float32": 2.0**-23,
    "tf32": 2.0**-10,
    "float16": 2.0**-10,
    "bfloat16": 2.0**-7,
    "float8_e4m3fn": 2.0**-3,
    "float8_e4m3fnuz": 2.0**-3,
    "float8_e5m2": 2.0**-2,
    "float8_e5m2fnuz": 2.0**-2,
}
COMPLEX = {"complex128": "float64", "complex64": "float32", "complex32": "float16"}
# The largest finite value of each format (torch.finfo(dtype).max; its lowest is the negative).
FINITE_MAX: dict[str, float] = {
    "float64": 1.7976931348623157e308,
    "float32": 3.4028234663852886e38,
    "bfloat16": 3.3895313892515355e38,
    "float16": 65504.0,
    "float8_e4m3fn": 448.0,
    "float8_e4m3fnuz": 240.0,
    "float8_e5m2": 57344.0,
    "float8_e5m2fnuz": 57344.0,
}

# The spacing of each format's subnormals (torch.finfo(dtype).smallest_subnormal): below its
# normal range a cast rounds to that absolute step, whatever the value's size (float16: values
# under 6e-8 flush to zero).
SUBNORMAL: dict[str, float] = {"float64": 2.0**-1074, "float32": 2.0**-149, "bfloat16": 2.0**-133,
                               "float16": 2.0**-24, "float8_e4m3fn": 2.0**-9, "float8_e5m2": 2.0**-16}


# the smallest normal number of each format (torch.finfo(dtype).tiny)
TINY: dict[str, float] = {"float64": 2.0**-1022, "float32": 2.0**-126, "bfloat16": 2.0**-126, "float16": 2.0**-14}


def tiny(dtype: str | None) -> float:
    """The smallest normal number of a dtype name (0 for one not listed)."""
    return TINY.get(_base(dtype), 0.0)


def subnormal(dtype: str | None) -> float:
    """The subnormal step of a dtype name (0 for one not listed)."""
    return SUBNORMAL.get(_base(dtype), 0.0)


def cast_floor(dtype: str | None, numel: int) -> float:
    """The most a cast to ``dtype`` moves ``numel`` elements below its normal range, norm-wise:
    half a subnormal step each."""
    return 0.5 * subnormal(dtype) * math.sqrt(max(numel, 0))


@dataclass(frozen=True)
class NoiseModel:
    """The thresholds of the verdict, in one place so a user can tune them.

    Attributes:
        abs_factor: an output whose inputs are exact may differ by this many epsilon of the
            lower precision (rounding plus a different summation order, e.g. thread count).
        ratio: an output may carry up to ``ratio`` times the relative error of its inputs;
            healthy bf16 ops measure up to ~3, real faults ~40.
        max_tolerance: cap of ``abs_factor * eps`` (float8 epsilons are large).
        element_factor: per-element tolerance, in epsilon, for the out-of-tolerance fraction.
        rel_floor: denominator floor of element-wise relative error, as a fraction of the
            reference's largest magnitude, so near-zero references do not explode.
        precision: force the precision of the target (e.g. "tf32"); None reads dtypes.
    """

    abs_factor: float = 16.0
    ratio: float = 10.0
    max_tolerance: float = 0.1
    element_factor: float = 64.0
    rel_floor: float = 1e-3
    precision: str | None = None

    def lower_dtype(self, dtype_a: str | None, dtype_b: str | None) -> str:
        """The lower-precision of two dtype names (integers and bools count as exact)."""
        a = _base(dtype_a if self.precision is None else _lower(dtype_a, self.precision))
        b = _base(dtype_b)
        return a if epsilon(a) >= epsilon(b) else b

    def tolerance(self, dtype: str) -> float:
        """Relative (norm-wise) error an exact-input operator may show in ``dtype``."""
        eps = epsilon(dtype)
        return min(self.abs_factor * eps, self.max_tolerance) if eps else 0.0

    def element_tolerance(self, dtype: str) -> float:
        """Per-element relative tolerance used by the out-of-tolerance fraction."""
        eps = epsilon(dtype)
        return min(self.element_factor * eps, self.max_tolerance) if eps else 0.0


def epsilon(dtype: str | None) -> float:
    """Epsilon of a dtype name; 0 for integer, bool and unknown types (compared exactly)."""
    return EPSILON.get(_base(dtype), 0.0)


def is_float(dtype: str | None) -> bool:
    """True for floating-point (and complex) dtype names."""
    return epsilon(dtype) > 0.0


def _base(dtype: str | None) -> str:
    name = str(dtype or "").replace("torch.", "")
    return COMPLEX.get(name, name)


def _lower(dtype: str | None, precision: str) -> str:
    base = _base(dtype)
    if not is_float(base):
        return base
    return precision if epsilon(precision) > epsilon(base) else base


def eps_units(error: float, dtype: str) -> float:
    """``error`` expressed in epsilon of ``dtype`` (inf for exact types with any error)."""
    eps = epsilon(dtype)
    if eps:
        return error / eps
    return 0.0 if error == 0 else math.inf


def dtype_extremes(t: dict[str, Any], r: dict[str, Any]) -> bool:
    """Do two float records each reach their own fill of a mask: their dtype's largest or
    lowest finite value (``torch.finfo(dtype).min``: −65504 in float16, −3.4e38 in float32) or
    an infinity, and not the same one? Then they differ by how a mask was encoded (by their
    dtypes; Falcon's sdpa path fills with −inf where its eager path takes finfo.min), not by
    what was computed."""
    a, b = _base(t.get("dtype")), _base(r.get("dtype"))
    if a not in FINITE_MAX or b not in FINITE_MAX:
        return False
    for key, sign in (("min", -1.0), ("max", 1.0)):
        vt, vr = t.get(key), r.get(key)
        if vt != vr and vt in (sign * FINITE_MAX[a], sign * math.inf) and vr in (sign * FINITE_MAX[b], sign * math.inf):
            return True
    return False
