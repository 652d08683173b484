"""Tensors stored as transposed planes (a Linear weight's gradient as autograd hands it over,
``x.mT``) are read in memory order (``native/_c/fastats_transposed.h``): the hash is the
row-major one bit for bit, in every kernel (portable, AVX2, AVX-512), min, max and the counts
are the contiguous copy's, the sums differ from its at most in their rounding."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from opscope.capture.torch import stats  # noqa: E402
from opscope.capture.torch.stats import cpu_stats, transposed_planes  # noqa: E402
from opscope.model.hashing import content_hash  # noqa: E402

if stats._fastats is None or getattr(stats._fastats, "stats_t", None) is None:
    pytest.skip("the statistics kernel is not built", allow_module_level=True)

# rows around every lane count and tail (8 and 16 lanes, 8-byte elements two words a row),
# columns odd and even, planes under outer dimensions
SHAPES = ((2, 2), (3, 5), (7, 4), (8, 6), (9, 3), (15, 2), (16, 16), (17, 10), (33, 18), (130, 70), (2, 37, 8),
          (3, 1, 24, 6), (512, 64))
DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "int16")
CASES = textwrap.dedent(f"""
    import json, torch
    from opscope.capture.torch.native import _fastats
    from opscope.capture.torch.stats import CODES
    torch.manual_seed(0)
    out = []
    for name in {DTYPES!r}:
        dt = getattr(torch, name)
        for shape in {SHAPES!r}:
            base = torch.randn(*shape[:-2], shape[-1], shape[-2], dtype=torch.float64) * 300
            base[..., 0, :] = 0.0
            t = base.to(dt).mT
            R, C = t.shape[-2], t.shape[-1]
            out.append([name, list(shape), _fastats.stats_t(t.data_ptr(), t.numel() // (R * C), R, C, CODES[dt])])
    print(json.dumps(out))
""")


def _run(simd: str) -> list:
    env = {k: v for k, v in os.environ.items() if k not in ("OPSCOPE_SIMD", "OPSCOPE_NO_SIMD")}
    if simd:
        env["OPSCOPE_SIMD"] = simd
    done = subprocess.run([sys.executable, "-c", CASES], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_every_kernel_gives_the_same_bits():
    portable = _run("portable")
    assert _run("avx2") == portable
    assert _run("") == portable
    odd = [(name, shape) for name, shape, got in portable if got is None]
    # 2-byte elements pair two columns into a word: an odd number of columns is not taken
    assert odd and all(name in ("float16", "bfloat16", "int16") and shape[-1] % 2 for name, shape in odd), odd


def _reference(t: torch.Tensor) -> tuple:
    copy = t.contiguous()
    words = copy.view(torch.int16) if copy.dtype == torch.bfloat16 else copy
    return cpu_stats(copy), content_hash(words.numpy())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32,
                                   torch.int64])
@pytest.mark.parametrize("shape", SHAPES)
def test_hash_is_row_major_and_statistics_are_the_copys(dtype, shape):
    torch.manual_seed(1)
    base = torch.randn(*shape[:-2], shape[-1], shape[-2]) * 50
    t = base.to(dtype).mT
    assert not t.is_contiguous() and transposed_planes(t) is not None
    got = cpu_stats(t)
    copy, want_hash = _reference(t)
    assert got[9] == copy[9] == want_hash
    assert got[0:2] == copy[0:2] and got[5:9] == copy[5:9]  # min, max, absmax, NaN, Inf and zero counts
    rms = copy[4] / math.sqrt(t.numel())  # float sums in another order: rounding of the values' scale
    assert abs(got[2] - copy[2]) <= 1e-6 * rms and np.allclose(got[3:5], copy[3:5], rtol=1e-6)  # mean; std, norm


def test_a_swap_within_a_row_changes_the_hash_not_the_extremes():
    """The hash follows each element's row-major place: two elements of one row swapped (a
    transposed weight gradient written to the wrong column) change it, though every statistic
    of the values is the same."""
    t = (torch.randn(40, 64) * 3).t()  # rows adjacent
    swapped = t.clone().t().contiguous().t()  # the same layout
    assert transposed_planes(swapped) == (1, 64, 40)
    a, b = swapped[5, 3].item(), swapped[5, 30].item()
    swapped[5, 3], swapped[5, 30] = b, a
    s, o = cpu_stats(swapped), cpu_stats(t)
    assert s[9] != o[9]
    assert s[0:2] == o[0:2] and s[6:9] == o[6:9]
    assert math.isclose(s[2], o[2], rel_tol=1e-6, abs_tol=1e-9)


def test_other_layouts_are_not_planes():
    x = torch.randn(4, 6, 8)
    assert transposed_planes(x) is None  # contiguous
    assert transposed_planes(x.mT) == (4, 8, 6)
    assert transposed_planes(x.mT[::2]) is None  # planes apart
    assert transposed_planes(x.permute(1, 2, 0)) is None  # the last dimension's stride is not the rows'
    assert transposed_planes(x[:, :, :1].mT) is None  # one row: contiguous already
    assert transposed_planes(torch.randn(5)[:, None].expand(5, 3)) is None  # a broadcast column
    assert transposed_planes(torch.randn(1, 6, 8).mT) == (1, 8, 6)
    empty = torch.randn(0, 3, 4).mT
    assert transposed_planes(empty) is None
