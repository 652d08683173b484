"""Error metrics of one tensor pair: a registry of pure functions, computed in float64.

The arrays are walked once, block by block (:mod:`opscope.compare.accumulate`: the C kernel, or
numpy in cache-sized chunks), accumulating a few sums in :class:`PairSums`. Every
registered metric is then a function of those sums. A metric that needs the elements
themselves registers with ``per_chunk=True``: it is called on each float64 chunk pair and
its values are combined with ``combine`` ("sum" or "max").

Add a metric::

    from opscope.compare.metrics import register_metric

    @register_metric("max_abs_over_norm")
    def max_abs_over_norm(s):
        return s.max_abs / max(s.ref_norm, 1e-30)

Metric code never logs and never raises on odd data: it returns nan or inf.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class PairSums:
    """What one pass over a pair leaves behind (float64 accumulators, finite elements only)."""

    n: int = 0
    sum_sq_diff: float = 0.0
    sum_abs_diff: float = 0.0
    max_abs: float = 0.0
    dot: float = 0.0
    sum_sq_target: float = 0.0
    sum_sq_reference: float = 0.0
    max_rel: float = 0.0
    sum_rel: float = 0.0
    out_of_tolerance: int = 0
    sum_sq_elem_rel: float = 0.0  # sum of min(1, |t - r| / |r|)^2: how noisy elements are
    nan_mismatch: int = 0
    inf_mismatch: int = 0
    bit_exact: bool | None = None
    lower_bound: bool = False  # statistics only: diff_norm is a lower bound
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def diff_norm(self) -> float:
        return math.sqrt(self.sum_sq_diff)

    @property
    def ref_norm(self) -> float:
        return math.sqrt(self.sum_sq_reference)


@dataclass(frozen=True)
class Metric:
    name: str
    fn: Callable[..., float]
    per_chunk: bool = False
    combine: str = "sum"


METRICS: dict[str, Metric] = {}


def register_metric(name: str, *, per_chunk: bool = False,
                    combine: str = "sum") -> Callable[[Callable[..., float]], Callable[..., float]]:
    """Register a metric under ``name``; refuses a name already taken.

    Args:
        name: the column name in pairs tables.
        per_chunk: the function takes ``(target_chunk, reference_chunk)`` float64 arrays;
            otherwise it takes the :class:`PairSums` of the pair.
        combine: how per-chunk values combine: "sum" or "max".
    """
    if combine not in ("sum", "max"):
        raise ValueError(f"combine must be 'sum' or 'max', not {combine!r}")

    def decorator(fn: Callable[..., float]) -> Callable[..., float]:
        if name in METRICS:
            raise ValueError(f"a metric named {name!r} is already registered ({METRICS[name].fn!r})")
        METRICS[name] = Metric(name, fn, per_chunk, combine)
        return fn

    return decorator


def unregister_metric(name: str) -> None:
    """Remove a metric (for tests and plug-ins that replace one of their own)."""
    METRICS.pop(name, None)


def _safe_div(a: float, b: float) -> float:
    if b == 0:
        return 0.0 if a == 0 else math.inf
    return a / b


@register_metric("cosine")
def cosine(s: PairSums) -> float:
    denom = math.sqrt(s.sum_sq_target) * math.sqrt(s.sum_sq_reference)
    if denom == 0:
        return 1.0 if s.sum_sq_diff == 0 else 0.0
    return max(-1.0, min(1.0, s.dot / denom))


@register_metric("max_abs")
def max_abs(s: PairSums) -> float:
    return s.max_abs


@register_metric("mean_abs")
def mean_abs(s: PairSums) -> float:
    return _safe_div(s.sum_abs_diff, s.n) if s.n else 0.0


@register_metric("max_rel")
def max_rel(s: PairSums) -> float:
    return s.max_rel


@register_metric("mean_rel")
def mean_rel(s: PairSums) -> float:
    return s.sum_rel / s.n if s.n else 0.0


@register_metric("rmse")
def rmse(s: PairSums) -> float:
    return math.sqrt(s.sum_sq_diff / s.n) if s.n else 0.0


@register_metric("rel_l2")
def rel_l2(s: PairSums) -> float:
    return _safe_div(s.diff_norm, s.ref_norm)


@register_metric("snr_db")
def snr_db(s: PairSums) -> float:
    if s.sum_sq_diff == 0:
        return math.inf
    if s.sum_sq_reference == 0:
        return -math.inf
    return 10.0 * math.log10(s.sum_sq_reference / s.sum_sq_diff)


@register_metric("out_of_tolerance")
def out_of_tolerance(s: PairSums) -> float:
    return s.out_of_tolerance / s.n if s.n else 0.0


@register_metric("elem_rel_rms")
def elem_rel_rms(s: PairSums) -> float:
    """RMS over elements of min(1, |t − r| / |r|): near 1 when elements are noise on both sides."""
    return math.sqrt(s.sum_sq_elem_rel / s.n) if s.n else 0.0


@register_metric("nan_mismatch")
def nan_mismatch(s: PairSums) -> float:
    return float(s.nan_mismatch)


@register_metric("inf_mismatch")
def inf_mismatch(s: PairSums) -> float:
    return float(s.inf_mismatch)


def finish(s: PairSums) -> dict[str, Any]:
    """All registered metrics of a pair, plus the raw norms the verdict needs."""
    out: dict[str, Any] = {name: m.fn(s) for name, m in METRICS.items() if not m.per_chunk}
    out.update(s.extra)
    out["diff_norm"] = s.diff_norm
    out["ref_norm"] = s.ref_norm
    out["bit_exact"] = s.bit_exact
    return out


# -- statistics only -----------------------------------------------------------------------
def from_statistics(t: dict[str, Any], r: dict[str, Any], *, exact_std: bool = False) -> PairSums:
    """A lower bound of the pair's error from the two records' statistics.

    Each of |Δnorm|, |Δmean|·√n, |Δstd|·√n, |Δmin|, |Δmax|, |Δabsmax| is at most ‖t − r‖
    (triangle and Cauchy-Schwarz inequalities), so their maximum bounds the L2 error from
    below: a difference the statistics show is real, but one they miss may exist.
    ``exact_std``: both rows' std is their tensor's own (measure.stds_exact), not one that
    may carry the rounding of float32 sums of squares (up to ~2^-12 of the mean).
    """
    n = int(r.get("numel") or t.get("numel") or 0)
    s = PairSums(n=n, lower_bound=True)
    ref_norm = _num(r.get("norm"))
    tgt_norm = _num(t.get("norm"))
    s.sum_sq_reference = _norm_or_bound(r, ref_norm, n) ** 2
    s.sum_sq_target = _norm_or_bound(t, tgt_norm, n) ** 2
    if (r.get("inf") and not math.isfinite(ref_norm)) or (t.get("inf") and not math.isfinite(tgt_norm)):
        s.extra["extremes_only"] = 1.0  # relative to an element's scale, not the norm: state.input_error
    s.nan_mismatch = abs(int(t.get("nan") or 0) - int(r.get("nan") or 0))
    s.inf_mismatch = abs(int(t.get("inf") or 0) - int(r.get("inf") or 0))
    root_n = math.sqrt(max(n, 1))
    # the statistics are sums taken in float32 lanes (float64 data in doubles): a shift
    # smaller than their own rounding says nothing, so each bound is net of it
    c = statistics_resolution(t, r)
    norms = (tgt_norm if math.isfinite(tgt_norm) else 0.0) + (ref_norm if math.isfinite(ref_norm) else 0.0)
    mean_sq = (norms / 2) ** 2 / max(n, 1)
    stds = [_num(t.get("std")), _num(r.get("std"))]
    std_noise = _std_noise(stds, mean_sq, c, exact_std)
    bounds = [abs(tgt_norm - ref_norm) - c * norms,
              abs(_num(t.get("mean")) - _num(r.get("mean"))) * root_n - c * norms,
              (abs(stds[0] - stds[1]) - 2 * std_noise) * root_n]
    for name in ("min", "max", "absmax"):  # exact: no sum involved
        bounds.append(abs(_num(t.get(name)) - _num(r.get(name))))
    bounds = [max(x, 0.0) if math.isfinite(x) else x for x in bounds]
    finite = [x for x in bounds if math.isfinite(x)]
    diff = max(finite) if finite else 0.0
    s.sum_sq_diff = diff**2
    # the largest element difference is at least each extreme's and the mean's shift, and
    # at least the RMS of the differences (so a printed error never outruns it)
    shifts = [abs(_num(t.get(k)) - _num(r.get(k))) for k in ("min", "max", "absmax", "mean")]
    s.max_abs = max([x for x in shifts if math.isfinite(x)] + [diff / root_n if n else 0.0])
    # cosine from norms alone is unknown: assume the closest pair the bound allows
    s.dot = (s.sum_sq_target + s.sum_sq_reference - s.sum_sq_diff) / 2
    s.sum_abs_diff = diff * root_n if n else 0.0
    s.max_rel = math.nan
    s.sum_rel = math.nan
    return s


def _std_noise(stds: list[float], mean_sq: float, c: float, exact: bool) -> float:
    """How far each std may be from its tensor's own: with float32 sums of squares, their
    rounding (c of mean_sq) is what is left of mean_sq - mean^2 where the values sit far from
    zero; exact, STD_RESOLUTION of the std (the kernel's worst case where its sums gave it)
    and 2^-26 of the RMS (a GPU's float64 sums of a near-constant tensor)."""
    if not all(math.isfinite(x) for x in stds):
        return 0.0
    if exact:
        return STD_RESOLUTION * max(stds) + 2.0**-26 * math.sqrt(mean_sq)
    return min(math.sqrt(c * mean_sq), c * mean_sq / max(min(stds), 1e-300))


def _norm_or_bound(row: dict[str, Any], norm: float, n: int) -> float:
    """The row's norm; where its sum of squares overflowed (an infinite norm with no NaN or
    Inf element: a mask filled with the dtype's lowest value, in dumps before sums of such
    blocks were taken in float64), the most it can be, absmax·√n, so that an error over it
    stays a lower bound. Where it holds Inf elements (scores masked with -inf, read whole:
    Longformer's sliding-window chunks), its largest finite extreme: only the extremes'
    shifts bound the error then (the sums are infinite), and they are element differences,
    so an element's scale is what they are relative to. 0 where nothing is known."""
    if math.isfinite(norm):
        return norm
    if row.get("inf") and not row.get("nan"):
        finite = [abs(x) for x in (_num(row.get("min")), _num(row.get("max"))) if math.isfinite(x)]
        return max(finite, default=0.0)
    absmax = _num(row.get("absmax"))
    if row.get("nan") or row.get("inf") or not math.isfinite(absmax):
        return 0.0
    return absmax * math.sqrt(max(n, 1))


# where a std is exact (measure.stds_exact): the kernel's std from its sums is off by at most
# 2^-16 · 64 / 2 of itself in the worst rounding (typically ~3e-5 or less; docs/format.md, Statistics)
STD_RESOLUTION = 1e-3
# data whose statistics are summed in doubles (the rest in float32 lanes)
_EXACT_SUMS = frozenset({"float64", "complex128", "int64", "int32", "int16", "int8", "uint8", "bool"})


def statistics_resolution(t: dict[str, Any], r: dict[str, Any]) -> float:
    """The relative difference of two tensors' norms or means that their statistics cannot
    resolve: the kernel sums float32 data in float32 lanes of up to 256 elements (blocks of
    4096 over 16 lanes), a relative rounding of about 2^-24 * sqrt(elements per lane), taken
    4 times over; float64 and integer data are summed in doubles."""
    def one(row: dict[str, Any]) -> float:
        if str(row.get("dtype")) in _EXACT_SUMS:
            return 1e-13
        n = int(row.get("numel") or 1)
        return 4 * 2.0**-24 * math.sqrt(max(1.0, min(n, 4096) / 16))
    return one(t) + one(r)


def _num(value: Any) -> float:
    try:
        return float(value) if value is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def identical(n: int) -> PairSums:
    """The sums of a bit-exact pair, known from equal hashes without reading data."""
    return PairSums(n=n, bit_exact=True)
