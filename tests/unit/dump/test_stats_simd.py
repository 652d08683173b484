"""The SIMD statistics kernels (AVX2, AVX-512) give bit for bit what the portable loops give."""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
import textwrap

import pytest

from opscope.capture.torch import stats

# around every lane, 64-byte step, block and hash tail; the last: over 512 KB (prefetch)
SIZES = (0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 4095, 4096, 4097, 4096 + 48 + 5, 10000, 300007)
PATTERNS = ("randn", "big", "zeros", "nan", "inf", "signed_zeros", "wide", "cancel", "overflow", "nan_mid",
            "subnormal", "all_nan", "offset", "mask", "constant", "far")
CASES = textwrap.dedent(f"""
    import json, math, random, torch
    from opscope.capture.torch.native import _fastats
    random.seed(0)
    torch.manual_seed(0)
    codes = {{torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}}
    out = []
    for dt, code in codes.items():
        for n in {SIZES!r}:
            for pattern in {PATTERNS!r}:
                t = torch.randn(n, dtype=torch.float64)
                if pattern == "big":
                    t = t * 1e30
                if pattern == "zeros":
                    t[::3] = 0.0
                if n and pattern == "nan":
                    t[random.randrange(n)] = math.nan
                if n and pattern == "inf":
                    t[random.randrange(n)] = math.inf
                    t[random.randrange(n)] = -math.inf
                if pattern == "signed_zeros":  # which zero a lane's min keeps depends on the order
                    t = t.abs()
                    t[1::3] = -0.0
                    t[2::3] = 0.0
                if pattern == "wide":  # lane sums so far apart that the order they are added in shows
                    t = t * torch.exp2(torch.randint(-60, 60, (n,), dtype=torch.float64))
                if pattern == "cancel":  # lanes 0 and 2 cancel: lane 1 survives only if added after them
                    t[::16] = 2.0**60
                    t[2::16] = -(2.0**60)
                if pattern == "overflow":  # finite elements whose sums overflow: counted, none found
                    t = torch.full((n,), 1e308 if dt == torch.float64 else 3e38, dtype=torch.float64)
                if n and pattern == "nan_mid":  # one block (stretch) of the middle only
                    t[n // 2] = math.nan
                if pattern == "mask":  # an attention mask: the dtype's lowest value above the diagonal
                    t[n // 3:] = torch.finfo(dt).min if dt != torch.float16 else -6e4
                if pattern == "subnormal":
                    t = t * (1e-310 if dt == torch.float64 else 1e-40)
                if pattern == "all_nan":
                    t[:] = math.nan
                if pattern in ("constant", "far"):  # the spread from a second pass (fastats_spread.h)
                    t = 1.1 + (t * 1e-3 if pattern == "far" else 0 * t)
                t = t.to(dt).contiguous()
                if pattern == "offset":  # not aligned to 4 bytes for 16-bit dtypes: unaligned loads
                    t = torch.cat([t[:1], t])[1:]
                out.append([repr(x) for x in _fastats.stats(t.data_ptr(), n, code)])
    ints = []  # the 8-bit types: integer sums, exact in the portable loop's doubles too
    for dt, code in {{torch.int8: 4, torch.uint8: 5, torch.bool: 9}}.items():
        for n in {SIZES!r} + (64 * 127 * 2 + 40, 600001):
            for pattern in ("random", "extremes", "zeros", "all_zeros"):
                lo, hi = (-128, 128) if dt == torch.int8 else (0, 2 if dt == torch.bool else 256)
                t = torch.randint(lo, hi, (n,))
                if pattern == "extremes":  # the sums of squares at their largest per step
                    t = torch.full((n,), lo if dt == torch.int8 else hi - 1)
                if pattern == "zeros":
                    t[::5] = 0
                if pattern == "all_zeros":  # the most a step's zero counts can take
                    t[:] = 0
                t = t.to(dt)
                ints.append([repr(x) for x in _fastats.stats(t.data_ptr(), n, code)])
    for dt, code in {{torch.int16: 6, torch.int32: 7, torch.int64: 8}}.items():  # the hash alone is SIMD
        for n in {SIZES!r}:
            t = torch.randint(-1000, 1000, (n + 1,)).to(dt)[1:]  # off 8-byte alignment
            ints.append([repr(x) for x in _fastats.stats(t.data_ptr(), n, code)])
    print(json.dumps({{"path": _fastats.SIMD_PATH, "simd": _fastats.SIMD, "stats": out, "ints": ints}}))
""")


@functools.cache
def _run(path: str) -> dict:
    """The cases' statistics with OPSCOPE_SIMD=path: "portable", "avx2" or "avx512" (the best the
    CPU has; the result's "path" says which ran)."""
    env = {**os.environ, "OPSCOPE_NO_SIMD": "0", "OPSCOPE_SIMD": path}
    proc = subprocess.run([sys.executable, "-c", CASES], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _assert_same(simd: dict, portable: dict) -> None:
    assert len(simd["stats"]) == 4 * len(SIZES) * len(PATTERNS)
    assert simd["stats"] == portable["stats"]  # min, max, sum, sumsq, nan, inf, zeros, hash, m2
    assert len(simd["ints"]) == 3 * (len(SIZES) + 2) * 4 + 3 * len(SIZES) and simd["ints"] == portable["ints"]
    nan_cases = [s for s in simd["stats"] if s[4] not in ("0",)]
    assert nan_cases and all(math.isfinite(float(s[0])) or s[0] in ("inf", "-inf") for s in nan_cases)


@pytest.mark.skipif(stats._fastats is None, reason="built without a C compiler")
def test_avx2_and_portable_kernels_agree_bit_for_bit():
    avx2, portable = _run("avx2"), _run("portable")
    assert (portable["path"], portable["simd"]) == ("portable", 0)
    if avx2["path"] != "avx2":
        pytest.skip("this CPU has no AVX2: only the portable loops exist here")
    _assert_same(avx2, portable)


@pytest.mark.skipif(stats._fastats is None, reason="built without a C compiler")
def test_avx512_and_portable_and_avx2_kernels_agree_bit_for_bit():
    avx512 = _run("avx512")
    if avx512["path"] != "avx512":
        pytest.skip("this CPU has no AVX-512 (F, BW, DQ and VL): the AVX2 or portable loops run here")
    _assert_same(avx512, _run("portable"))
    assert avx512["stats"] == _run("avx2")["stats"] and avx512["ints"] == _run("avx2")["ints"]


@pytest.mark.skipif(stats._fastats is None, reason="built without a C compiler")
def test_the_old_switch_still_runs_the_portable_loops():
    env = {**os.environ, "OPSCOPE_NO_SIMD": "1"}
    code = "from opscope.capture.torch.native import _fastats; print(_fastats.SIMD_PATH, _fastats.SIMD)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.stdout.split() == ["portable", "0"], proc.stderr
