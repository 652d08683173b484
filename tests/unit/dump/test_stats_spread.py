"""The std the kernel writes is the data's own, also where the values sit far from zero against
their spread (a loss, a LayerNorm weight, activations with an offset): sums of float32 squares
left only their rounding there (native/_c/fastats_spread.h)."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from dump_helpers import small_transformer, train_with

from opscope.capture.torch.stats import cpu_stats


def _std(t: torch.Tensor | np.ndarray) -> float:
    """The population std of t's values, two-pass in exactly rounded float64 sums."""
    x = (t.double() if isinstance(t, torch.Tensor) else np.asarray(t, dtype=np.float64)).flatten().tolist()
    mean = math.fsum(x) / len(x)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in x) / len(x))


def _cases() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    r = torch.randn(100_000, generator=g)
    return {
        "loss": torch.tensor(4.4575042725),
        "ones": torch.ones(768),
        "constant, three blocks": torch.full((10_000,), 1.1),
        "randn + 1000": r + 1000,
        "layernorm weight": 1 + 0.01 * r[:768],
        "far, many blocks": 100 + r * 1e-3,
        "uniform + 10": 10 + torch.rand(4096 * 5 + 7, generator=g),
        "bfloat16 constant": torch.full((9000,), 1.1, dtype=torch.bfloat16),
        "bfloat16 + 50": (50 + r[:9000]).to(torch.bfloat16),
        "float16 + 30": (30 + r[:9000] * 0.1).to(torch.float16),
        "float64 constant": torch.full((10_000,), 1.1, dtype=torch.float64),
        "float64 + 1e6": r.double() + 1e6,
        "int64 constant past 2^53 squared": torch.full((5000,), 10**15, dtype=torch.int64),
        "int64 + 2^40": torch.randint(0, 1000, (5000,), generator=g) + 2**40,
        "int32": torch.randint(-1000, 1000, (999,), generator=g, dtype=torch.int32),
        "bool, all true": torch.ones(3000, dtype=torch.bool),
    }


@pytest.mark.parametrize("name", list(_cases()))
def test_the_kernels_std_is_the_datas(name):
    t = _cases()[name]
    got, want = cpu_stats(t)[3], _std(t)
    if want == 0:
        assert got == 0.0, (name, got)
    else:
        assert got == pytest.approx(want, rel=1e-9), (name, got, want)


def test_a_wide_spread_keeps_its_one_pass_std():
    """Data near zero take their spread from the sums (no second pass): still to ~1e-6."""
    t = torch.randn(1_000_000, generator=torch.Generator().manual_seed(1))
    assert cpu_stats(t)[3] == pytest.approx(_std(t), rel=1e-6)


@pytest.mark.parametrize("backend", ["native", "python"])
def test_every_dumped_rows_std_is_its_tensors(tmp_path, monkeypatch, backend):
    """A training step dumped with its tensors: each row's std is that of the tensor stored with
    it (the loss's is 0: it was 0.00061 of a loss of 4.46)."""
    _, dump = train_with(backend, monkeypatch, tmp_path / "d", 1, small_transformer, data="tensor")
    rows = [r for r in dump.records().to_pylist() if r["data"] and r["std"] is not None and not r["nan"]]
    assert len(rows) > 100
    losses = [r for r in rows if r["numel"] == 1 and r["io"] == "output" and "loss" in r["op"]]
    assert losses and all(r["std"] == 0.0 for r in losses), losses
    for r in rows:
        t = dump.row_tensor(r)
        want = _std(t) if t.size else 0.0
        assert r["std"] == pytest.approx(want, rel=1e-6, abs=1e-12 * (r["absmax"] or 0)), (r["op"], r["io"], r["slot"])


def test_a_kernel_built_from_older_sources_is_not_used():
    """An extension left from before the spread (an editable install not rebuilt) returns no
    squared deviations: opscope says so, and measures with torch instead of writing its std."""
    code = textwrap.dedent("""
        import sys, types, warnings
        stale = types.ModuleType("opscope.capture.torch.native._fastats")
        stale.HASH, stale.SIMD = "wsum64-v2", 1  # no SPREAD
        sys.modules[stale.__name__] = stale
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch
            from opscope.capture.torch import stats
        print(stats._fastats is None, stats.cpu_stats(torch.tensor(4.4575042725))[3])
        print([str(w.message) for w in caught if "older sources" in str(w.message)])
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    used, messages = proc.stdout.splitlines()
    assert used == "True 0.0"
    assert "pip install -e ." in messages
