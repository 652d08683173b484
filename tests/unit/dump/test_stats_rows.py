"""Tensors stored as rows (native/_c/fastats_rows.h): a tensor whose elements in row-major order
are rows of 16 or more adjacent elements, anywhere in memory (attention's heads-permuted
tensors, a slice of the last dimension), is read in place, row by row. Every statistic and the
hash must be bit for bit those of the same values laid out contiguously, in every dtype the
loops take, across several blocks of 4096 elements, with NaN, Inf, zeros, near-constant blocks
and float32 sums that overflow; layouts the loops do not take are gathered as before."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

import opscope

COLUMNS = ("hash", "min", "max", "mean", "std", "norm", "absmax", "nan", "inf", "zeros")


def _heads(b: int, h: int, t: int, d: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A (b, h, t, d) view of (b, t, h, d) memory: what view(...).transpose(1, 2) makes."""
    return torch.randn(b, t, h, d).to(dtype).transpose(1, 2)


def _special(x: torch.Tensor) -> torch.Tensor:
    """``x`` (heads-permuted) with NaN, Inf and zero rows, a near-constant block (values far from
    zero against their spread: the spread's second pass) and values that overflow float32 sums."""
    x = x.transpose(1, 2).clone().transpose(1, 2)  # (the same layout, its own memory)
    x[0, 0, 0, 3] = float("nan")
    x[0, 1, 2, 5] = float("inf")
    x[0, 1, 3, 7] = -float("inf")
    x[0, 0, 5] = 0.0
    x[1, 0] = 1000.0 + 0.001 * x[1, 0]  # near-constant
    if x.dtype == torch.float32:
        x[1, 1, 1, :4] = 3e19  # squares past float32's range: the block summed in float64
    return x


def _layouts() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [
        _heads(2, 4, 128, 64), _heads(2, 4, 100, 16), _heads(1, 2, 64, 128), _heads(3, 2, 5, 4096),
        _heads(2, 4, 128, 64, torch.bfloat16), _heads(2, 4, 70, 32, torch.float16),
        _heads(1, 3, 64, 128, torch.bfloat16),
        _heads(2, 4, 128, 64)[..., :32], _heads(2, 4, 128, 64)[..., 32:],  # rotate_half's slices
        _special(_heads(2, 4, 64, 64)), _special(_heads(2, 4, 64, 64, torch.bfloat16)),
        _special(_heads(2, 4, 64, 32, torch.float16)),
        # gathered as before: rows of a length that does not divide a block, half rows of 16; a
        # last dimension broadcast (a mean's backward expands its gradient so)
        _heads(2, 4, 64, 48), _heads(2, 4, 64, 16, torch.bfloat16), _heads(2, 4, 64, 8),
        torch.randn(4, 128, 1).expand(4, 128, 256), torch.randn(4, 128, 1).bfloat16().expand(4, 128, 64),
    ]


def test_tensors_stored_as_rows_are_measured_as_their_contiguous_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", "native")
    tensors = _layouts()
    assert not any(t.is_contiguous() for t in tensors) and all(t.stride(-1) == 1 for t in tensors[:-2])
    copies = [t.contiguous() for t in tensors]
    with opscope.dump(tmp_path / "d") as d:
        for t in tensors + copies:
            t.sum()
        d.step()
    df = opscope.load(tmp_path / "d").records().to_pandas(integer_object_nulls=True)
    rows = df[(df.op.str.startswith("aten.sum")) & (df.io == "input")].sort_values("seq")
    assert len(rows) == 2 * len(tensors)
    got, want = rows.iloc[:len(tensors)], rows.iloc[len(tensors):]
    assert list(got.numel) == [t.numel() for t in tensors]
    for i in range(len(tensors)):
        for c in COLUMNS:
            a, b = got.iloc[i][c], want.iloc[i][c]
            assert (a == b) or (a != a and b != b), (i, c, a, b)
    special = got.iloc[9:12]
    assert list(special.nan) == [1, 1, 1] and list(special.inf) == [2, 2, 2]
    assert all(z >= 32 for z in special.zeros)  # the zero row


def test_a_heads_permuted_product_keeps_its_statistics_through_a_model_step(tmp_path, monkeypatch):
    """The layout as a model makes it: a projection viewed as heads and transposed, multiplied
    (rotary embeddings' ``q * cos``: the product keeps the permuted strides) and read by SDPA.
    The product's row carries what torch computes for it."""
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", "native")
    torch.manual_seed(1)
    proj = torch.nn.Linear(64, 256)
    x, cos = torch.randn(2, 32, 64), torch.randn(32, 64)
    with opscope.dump(tmp_path / "d") as d:
        q = proj(x).view(2, 32, 4, 64).transpose(1, 2)
        prod = q * cos
        out = torch.nn.functional.scaled_dot_product_attention(prod, prod, prod)
        out.sum().backward()
        d.step()
    assert not prod.is_contiguous() and prod.stride(-1) == 1
    df = opscope.load(tmp_path / "d").records().to_pandas(integer_object_nulls=True)
    row = df[(df.op == "aten.mul.Tensor") & (df.io == "output") & (df.phase == "forward")].iloc[0]
    want = prod.detach().double()
    assert row["min"] == float(want.min()) and row["max"] == float(want.max())
    assert math.isclose(row["mean"], float(want.mean()), rel_tol=1e-6)
    assert math.isclose(row["norm"], float(want.norm()), rel_tol=1e-6)
    assert row["hash"] == opscope.model.hashing.content_hash(prod.detach().contiguous().numpy())


@pytest.mark.parametrize("path", ["avx2", "portable"])
def test_the_avx2_and_portable_paths_give_the_same_rows(tmp_path, path):
    """The rows' statistics with the kernel's AVX2 loops (fastats_rows.h's own) and without SIMD
    (gathered), in a process of their own (the kernel picks its loops once): the same equality."""
    env = {**os.environ, "OPSCOPE_NO_SIMD": "0", "OPSCOPE_SIMD": path}
    test = f"{__file__}::test_tensors_stored_as_rows_are_measured_as_their_contiguous_copy"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
                           str(tmp_path / "t"), test], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
