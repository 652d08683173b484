"""The SIMD statistics kernels give bit for bit what the portable loops give."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest

from opscope.capture.torch import stats

CASES = textwrap.dedent("""
    import json, math, random, torch
    from opscope.capture.torch.native import _fastats
    random.seed(0)
    torch.manual_seed(0)
    codes = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}
    out = []
    for dt, code in codes.items():
        for n in (0, 1, 15, 16, 17, 4095, 4096, 4097, 10000):
            for pattern in ("randn", "big", "zeros", "nan", "inf"):
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
                t = t.to(dt).contiguous()
                out.append([repr(x) for x in _fastats.stats(t.data_ptr(), n, code)])
    print(json.dumps({"simd": _fastats.SIMD, "stats": out}))
""")


def _run(no_simd: bool) -> dict:
    env = {**os.environ, "OPSCOPE_NO_SIMD": "1" if no_simd else "0"}
    proc = subprocess.run([sys.executable, "-c", CASES], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.skipif(stats._fastats is None, reason="built without a C compiler")
def test_simd_and_portable_kernels_agree_bit_for_bit():
    simd, portable = _run(False), _run(True)
    assert portable["simd"] == 0
    if not simd["simd"]:
        pytest.skip("this CPU has no AVX2: only the portable loops exist here")
    assert len(simd["stats"]) == 4 * 9 * 5
    assert simd["stats"] == portable["stats"]  # min, max, sum, sumsq, nan, inf, zeros, hash
    nan_cases = [s for s in simd["stats"] if s[4] not in ("0",)]
    assert nan_cases and all(math.isfinite(float(s[0])) or s[0] in ("inf", "-inf") for s in nan_cases)
