"""Tensor statistics: min, max, mean, std, L2 norm, abs-max, NaN/Inf/zero counts, hash.

Two engines, same results (see docs/format.md for the definitions):

- :func:`cpu_stats` — one fused pass in C (``_fastats``) over a contiguous CPU tensor,
  releasing the GIL, so a worker thread reduces while the step goes on.
- :func:`device_stats` — torch reductions issued without any synchronisation; the
  results stay on the device as two small tensors until :func:`materialize` moves every
  pending result of a step to the host in one batch. Used on CUDA/NPU, and on CPU when
  the C kernel is unavailable or ``OPSCOPE_STATS_BACKEND=torch``.

NaN propagates into min/max/mean/std/norm as in torch; std is the population std.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Protocol

import torch

from opscope.model.hashing import ALGORITHM as HASH_ALGORITHM
from opscope.model.tensor_stats import finish

# One statistics tuple of the C kernel: min, max, sum, sum of squares, NaN, Inf, zero counts, hash,
# squared deviations from the mean.
RawStats = tuple[float, float, float, float, int, int, int, int, float]


class FastStats(Protocol):
    """The C kernel (``native/_fastats``, built from ``native/_c/fastats.c``): one pass over a
    CPU buffer, and a queue of such passes run by its own thread without the GIL."""

    SIMD: int
    HASH: str
    SPREAD: int

    def submit(self, ptr: int, numel: int, code: int, dst: int = 0, /) -> int: ...
    def wait(self, job: int, /) -> None: ...
    def take(self, job: int, /) -> None: ...
    def done(self) -> int: ...
    def results(self, start: int, end: int, /) -> list[tuple[Any, ...]]: ...  # finished: STAT_NAMES order
    def reset(self) -> None: ...
    def stats(self, ptr: int, numel: int, code: int, /) -> RawStats: ...


def _load_kernel() -> FastStats | None:
    try:
        from opscope.capture.torch.native import _fastats as kernel
    except ImportError:  # built without a C compiler: torch reductions instead
        return None
    return kernel


_fastats = _load_kernel()
if _fastats is not None and (getattr(_fastats, "HASH", "wsum64-v1") != HASH_ALGORITHM
                             or getattr(_fastats, "SPREAD", 0) < 1):
    # an extension built from older sources would write another hash under this one's name, or
    # the std of float32 sums of squares (docs/format.md, Statistics)
    warnings.warn(f"opscope: the statistics kernel was built from older sources (hash "
                  f"{getattr(_fastats, 'HASH', 'wsum64-v1')}, spread {getattr(_fastats, 'SPREAD', 0)}; "
                  f"this opscope: {HASH_ALGORITHM}, 1): using torch reductions; rebuild it with "
                  f"`pip install -e .` (or scripts/install.sh)", stacklevel=2)
    _fastats = None

CODES = {
    torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3, torch.int8: 4,
    torch.uint8: 5, torch.int16: 6, torch.int32: 7, torch.int64: 8, torch.bool: 9,
}
# float16 through the C kernel only with its SIMD path (the portable loop is slower than torch)
F16_FAST = _fastats is not None and bool(getattr(_fastats, "SIMD", 0))
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_GOLD, _MIX1, _MIX2, _M32 = 0x9E3779B9, 0x7FEB352D, 0x846CA68B, 0xFFFFFFFF


# planes stored transposed, read in memory order (None: a build without it, or no kernel)
_STATS_T = getattr(_fastats, "stats_t", None)


def transposed_planes(t: torch.Tensor) -> tuple[int, int, int] | None:
    """``(planes, rows, cols)`` where ``t`` is planes of its last two dimensions each stored
    transposed (rows adjacent in memory), the planes one after another: a Linear weight's
    gradient as autograd hands it over, ``x.mT`` of a contiguous ``x`` (``gather.h``'s
    ``transposed_planes``, the same test). The kernel reads such a tensor in memory order: its
    hash is the row-major one, its sums may differ from its contiguous copy's in the last bits."""
    if t.dim() < 2:
        return None
    rows, cols = t.shape[-2], t.shape[-1]
    strides = t.stride()
    if rows < 2 or cols < 2 or strides[-2] != 1 or strides[-1] != rows:
        return None
    expect = rows * cols
    for size, stride in zip(reversed(t.shape[:-2]), reversed(strides[:-2]), strict=True):
        if size != 1 and stride != expect:
            return None
        expect *= size
    planes = t.numel() // (rows * cols)
    return (planes, rows, cols) if planes else None


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _as_real(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t) if t.is_complex() else t


def cpu_stats(t: torch.Tensor) -> tuple[Any, ...]:
    """Statistics of a CPU tensor in one C pass (torch fallback for other dtypes)."""
    t = _as_real(t)
    code = CODES.get(t.dtype)
    # (a strided view made contiguous first on either path: torch's own reductions sum it in
    # another order, float64's std differed from its copy's in the last bit)
    if _fastats is None or code is None or (code == 2 and not F16_FAST):  # scalar C float16 is slow
        return materialize_one(device_stats(t.contiguous()))
    raw = None
    if _STATS_T is not None and not t.is_contiguous() and (planes := transposed_planes(t)) is not None:
        raw = _STATS_T(t.data_ptr(), *planes, code)  # in memory order, as the native capture reads it
    if raw is None:
        t = t.contiguous()
        raw = _fastats.stats(t.data_ptr(), t.numel(), code)
    mn, mx, total, sumsq, nan, inf, zeros, h, m2 = raw
    return finish(mn, mx, total, sumsq, nan, inf, zeros, h, t.numel(), m2)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``x·c mod 2^32`` for int64 ``x`` in [0, 2^32) and a 32-bit constant, in halves of ``c``
    so that no product overflows int64."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _i32(c: int) -> int:
    """A 32-bit constant as the int32 of the same bits."""
    return c - (1 << 32) if c >= 1 << 31 else c


def _xor_high_half(x: torch.Tensor) -> None:
    """``x ^= x >> 16`` (a logical shift) of int32 ``x``, in place: each word's low 16-bit half
    (little-endian: the first) flipped by its high half."""
    halves = x.view(torch.int16).view(-1, 2)
    halves[:, 0].bitwise_xor_(halves[:, 1])


def _words_of(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes (row-major, little-endian) as int32 words, the last padded with zeros."""
    raw = t.contiguous().reshape(-1).view(torch.uint8)
    if raw.numel() % 4:
        raw = torch.cat([raw, raw.new_zeros(4 - raw.numel() % 4)])
    try:
        return raw.view(torch.int32)
    except RuntimeError:  # a view whose storage offset is not a multiple of 4 bytes
        return raw.clone().view(torch.int32)


def _hash_words(t: torch.Tensor) -> torch.Tensor:
    """``wsum64-v2`` (:mod:`opscope.model.hashing`) as torch reductions on ``t``'s device: int32
    arithmetic (a product mod 2^32 is the same bits signed or not; a logical right shift is an
    arithmetic one masked), each sum taken in int64, whose low 32 bits are the unsigned sum's.
    The same ops as the native observer's (native/_c/dumpobs_device.h), ~15 launches."""
    w = _words_of(t)
    if w.numel() >= 1 << 31:  # word indices past int32: the int64 arithmetic
        return _hash_words64(w)
    salt = torch.arange(w.numel(), device=t.device, dtype=torch.int32).mul_(_i32(_GOLD))
    x = w ^ salt
    _xor_high_half(x)
    x.mul_(_i32(_MIX1))
    x ^= (x >> 15) & 0x1FFFF
    x.mul_(_i32(_MIX2))
    _xor_high_half(x)
    h2 = x.sum(dtype=torch.int64) & _M32
    h1 = x.bitwise_xor_(salt).sum(dtype=torch.int64) & _M32
    return (h1 << 32) | h2


def _hash_words64(words: torch.Tensor) -> torch.Tensor:
    """:func:`_hash_words` in int64 arithmetic (word indices of 2^31 and more)."""
    w = words.to(torch.int64) & _M32
    salt = _mul32(torch.arange(w.numel(), device=w.device, dtype=torch.int64) & _M32, _GOLD)
    x = w ^ salt
    x = x ^ (x >> 16)
    x = _mul32(x, _MIX1)
    x = x ^ (x >> 15)
    x = _mul32(x, _MIX2)
    x = x ^ (x >> 16)
    h1 = (x ^ salt).sum() & _M32
    h2 = x.sum() & _M32
    return (h1 << 32) | h2


def device_stats(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Issue the reductions of ``t`` on its device; nothing is synchronised.

    Returns ``(floats, ints, numel)`` where floats = [min, max, sum, sumsq] (float64) and
    ints = [nan, inf, zeros, hash] (int64), both still on the device.
    """
    t = _as_real(t.detach())
    n = t.numel()
    if n == 0:
        z = torch.zeros(4, dtype=torch.float64, device=t.device)
        return z, torch.zeros(4, dtype=torch.int64, device=t.device), 0
    f = t.double() if t.dtype in (torch.float64, torch.int64, torch.int32) else t.float()
    mn, mx = torch.aminmax(f.reshape(-1))
    # squares in float64: a float32 square overflows beyond ~1.8e19 (a mask of finfo.min)
    floats = torch.stack([mn.double(), mx.double(), f.sum(dtype=torch.float64),
                          (f.double() * f.double()).sum() if f.dtype == torch.float64
                          else torch.linalg.vector_norm(f, dtype=torch.float64).square()])
    if t.dtype in FLOATS:
        nan, inf = torch.isnan(f).sum(), torch.isinf(f).sum()
    else:
        nan = inf = torch.zeros((), dtype=torch.int64, device=t.device)
    ints = torch.stack([nan, inf, (f == 0).sum(), _hash_words(t)])
    return floats, ints, n


def materialize_one(pending: tuple[torch.Tensor, torch.Tensor, int]) -> tuple[Any, ...]:
    floats, ints, n = pending
    return _finish_pair(floats.tolist(), ints.tolist(), n)


def _finish_pair(fl: list[float], it: list[int], n: int) -> tuple[Any, ...]:
    mn, mx, total, sumsq = fl
    nan, inf, zeros, h = it
    if nan:  # aminmax on NaN data gives NaN already; keep min/max definitions aligned with C
        mn = mx = math.nan
    return finish(mn, mx, total, sumsq, nan, inf, zeros, h & 0xFFFFFFFFFFFFFFFF, n)


def materialize(pendings: list[tuple[torch.Tensor, torch.Tensor, int]]) -> list[tuple[Any, ...]]:
    """Move many device results to the host with one transfer per device and dtype."""
    if not pendings:
        return []
    floats = torch.stack([p[0] for p in pendings]).cpu().tolist()
    ints = torch.stack([p[1] for p in pendings]).cpu().tolist()
    return [_finish_pair(f, i, p[2]) for f, i, p in zip(floats, ints, pendings, strict=True)]
