"""The block accumulation of one tensor pair: the sums of :class:`~opscope.compare.metrics.PairSums`,
built block by block by the C kernel (:mod:`opscope.compare.kernel`) or numpy's chunked pass.

Blocks come from :mod:`opscope.compare.stream` (read piece by piece from the shards) or from
:func:`accumulate` (two arrays in memory). numpy's pass walks each block in chunks of
:data:`CHUNK` elements (cache-sized, so memory stays bounded and numpy stays fast); a
metric registered with ``per_chunk=True`` is called on each float64 chunk pair there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from opscope.compare.metrics import METRICS, Metric, PairSums

CHUNK = 16384
BLOCK = 1 << 18  # elements per block handed to the C kernel (or to numpy's chunked pass)


def accumulate(target: np.ndarray, reference: np.ndarray, *, rel_floor: float,
               rtol: float) -> PairSums:
    """One float64 pass over two same-size arrays, block by block (:class:`Accumulator`).

    Args:
        target, reference: arrays of equal element count (any real dtype; flattened).
        rel_floor: absolute floor of the element-wise relative error's denominator.
        rtol: element-wise relative tolerance for the out-of-tolerance count.
    """
    a = target.reshape(-1)
    b = reference.reshape(-1)
    acc = Accumulator(rel_floor=rel_floor, rtol=rtol)
    for start in range(0, a.size, BLOCK):
        acc.add(a[start:start + BLOCK], b[start:start + BLOCK])
    return acc.result()


class Accumulator:
    """The sums of one pair, built block by block (equal-size flat block pairs, in any order).

    The C kernel (:mod:`opscope.compare.kernel`) takes a block when it can and no per-chunk
    metric is registered; its sums are kept as they come and added up once, in
    :meth:`result`. Other blocks, and one holding NaN or Inf, take numpy's chunked pass (the
    masked one for NaN/Inf: mismatches counted, finite pairs measured).
    """

    def __init__(self, *, rel_floor: float, rtol: float) -> None:
        self.rel_floor, self.rtol = rel_floor, rtol
        self.chunked = [m for m in METRICS.values() if m.per_chunk]
        self._sums = PairSums(n=0)
        self._native: list[tuple[float, ...]] = []
        self._native_n = 0

    def add(self, a: np.ndarray, b: np.ndarray, a_dtype: str | None = None, b_dtype: str | None = None) -> None:
        """Add one block pair. ``a_dtype``/``b_dtype`` name the opscope dtype of a block read
        as stored (bfloat16 and float8 as their bits); None: the array's own dtype."""
        from opscope.compare import kernel

        native = None if self.chunked else kernel.sums(a, a_dtype or a.dtype.name, b, b_dtype or b.dtype.name,
                                                       self.rel_floor, self.rtol)
        if native is not None and math.isfinite(native[0]) and math.isfinite(native[3]):
            self._native.append(native)
            self._native_n += a.size
            return
        _merge(self._sums, _numpy_block(_widen(a, a_dtype), _widen(b, b_dtype), self.rel_floor, self.rtol,
                                        self.chunked))

    def add_sums(self, blocks: Sequence[tuple[float, ...]], n: int) -> None:
        """Add blocks the C kernel summed elsewhere (:func:`opscope.compare.kernel.stream`),
        ``n`` elements in all: each block's sums as :meth:`add` keeps them (finite, in order)."""
        self._native += blocks
        self._native_n += n

    def result(self) -> PairSums:
        """The pair's sums so far."""
        if self._native:
            cols = list(zip(*self._native, strict=True))
            _merge(self._sums, PairSums(
                n=self._native_n, sum_sq_diff=sum(cols[0]), sum_abs_diff=sum(cols[1]), max_abs=max(cols[2]),
                dot=sum(cols[3]), sum_sq_target=sum(cols[4]), sum_sq_reference=sum(cols[5]), max_rel=max(cols[6]),
                sum_rel=sum(cols[7]), sum_sq_elem_rel=sum(cols[8]), out_of_tolerance=int(sum(cols[9]))))
            self._native, self._native_n = [], 0
        return self._sums


def _widen(arr: np.ndarray, dtype: str | None) -> np.ndarray:
    if dtype is None or (dtype != "bfloat16" and not dtype.startswith("float8")):
        return arr
    from opscope.storage.safetensors_io import widen

    return widen(arr, dtype)


def _numpy_block(a: np.ndarray, b: np.ndarray, rel_floor: float, rtol: float, chunked: list[Metric]) -> PairSums:
    s = PairSums(n=a.size)
    buf = _Buffers(min(CHUNK, max(a.size, 1)))
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf: measured again on the masked path
        for start in range(0, a.size, CHUNK):
            stop = min(start + CHUNK, a.size)
            _chunk(a[start:stop], b[start:stop], s, buf, rel_floor, rtol, chunked)
    if not (math.isfinite(s.sum_sq_diff) and math.isfinite(s.dot)) or s.nan_mismatch or s.inf_mismatch:
        s = _accumulate_masked(a, b, rel_floor=rel_floor, rtol=rtol)
    return s


class _Buffers:
    def __init__(self, size: int) -> None:
        self.a = np.empty(size, np.float64)
        self.b = np.empty(size, np.float64)
        self.d = np.empty(size, np.float64)
        self.r = np.empty(size, np.float64)
        self.q = np.empty(size, np.float64)


def _chunk(a: np.ndarray, b: np.ndarray, s: PairSums, buf: _Buffers, rel_floor: float,
           rtol: float, chunked: list[Metric]) -> None:
    n = a.size
    a64, b64, d, r, q = buf.a[:n], buf.b[:n], buf.d[:n], buf.r[:n], buf.q[:n]
    a64[...] = a
    b64[...] = b
    np.subtract(a64, b64, out=d)
    s.sum_sq_diff += float(np.dot(d, d))
    s.dot += float(np.dot(a64, b64))
    s.sum_sq_target += float(np.dot(a64, a64))
    s.sum_sq_reference += float(np.dot(b64, b64))
    np.abs(d, out=d)
    s.sum_abs_diff += float(d.sum())
    s.max_abs = max(s.max_abs, float(d.max()) if n else 0.0)
    np.abs(b64, out=r)
    np.maximum(r, 1e-300, out=q)
    np.divide(d, q, out=q)
    np.minimum(q, 1.0, out=q)
    s.sum_sq_elem_rel += float(np.dot(q, q))
    np.maximum(r, rel_floor, out=r)
    np.divide(d, r, out=r)
    s.max_rel = max(s.max_rel, float(r.max()) if n else 0.0)
    s.sum_rel += float(r.sum())
    s.out_of_tolerance += int(np.count_nonzero(r > rtol))
    for m in chunked:
        value = float(m.fn(a64, b64))
        old = s.extra.get(m.name)
        s.extra[m.name] = value if old is None else (old + value if m.combine == "sum" else max(old, value))


def _accumulate_masked(a: np.ndarray, b: np.ndarray, *, rel_floor: float, rtol: float) -> PairSums:
    """The slow path for pairs holding NaN or Inf: mismatches counted, finite pairs measured."""
    s = PairSums(n=0)
    chunked = [m for m in METRICS.values() if m.per_chunk]
    for start in range(0, a.size, CHUNK):
        a64 = a[start:start + CHUNK].astype(np.float64)
        b64 = b[start:start + CHUNK].astype(np.float64)
        na, nb = np.isnan(a64), np.isnan(b64)
        ia, ib = np.isinf(a64), np.isinf(b64)
        s.nan_mismatch += int(np.count_nonzero(na != nb))
        s.inf_mismatch += int(np.count_nonzero((ia != ib) | (ia & ib & (np.sign(a64) != np.sign(b64)))))
        keep = ~(na | nb | ia | ib)
        a64, b64 = a64[keep], b64[keep]
        with np.errstate(over="ignore", invalid="ignore"):
            part = PairSums(n=a64.size)
            if a64.size:
                _chunk(a64, b64, part, _Buffers(a64.size), rel_floor, rtol, chunked)
        _merge(s, part)
    return s


def _merge(s: PairSums, part: PairSums) -> None:
    s.n += part.n
    for name in ("sum_sq_diff", "sum_abs_diff", "dot", "sum_sq_target", "sum_sq_reference",
                 "sum_rel", "out_of_tolerance", "sum_sq_elem_rel", "nan_mismatch", "inf_mismatch"):
        setattr(s, name, getattr(s, name) + getattr(part, name))
    s.max_abs = max(s.max_abs, part.max_abs)
    s.max_rel = max(s.max_rel, part.max_rel)
    for key, value in part.extra.items():
        m = METRICS.get(key)
        old = s.extra.get(key)
        s.extra[key] = value if old is None else (max(old, value) if m and m.combine == "max" else old + value)
