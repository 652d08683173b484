"""A dump whose std is each tensor's own (manifest ``std``: ``deviations``) bounds a pair's error
by it as closely as that allows. Older dumps' std could carry the rounding of float32 sums of
squares, up to ~2^-12 of the mean, and compare allowed for it: a change in the spread of a
tensor sitting far from zero (a LayerNorm weight near 1) went unseen."""

from __future__ import annotations

import torch

import opscope
from opscope.compare.measure import stds_exact
from opscope.storage.format import STD_METHOD

N = 4096


def _layer_norm_run(path, *, fault: bool) -> None:
    """A LayerNorm whose weight is 1 ± 0.01; the fault sets a tenth of them to 1: the same
    min, max and mean, a spread 5% smaller, a norm 5e-6 smaller."""
    torch.manual_seed(0)
    ln = torch.nn.LayerNorm(N)
    with torch.no_grad():
        w = 1 + 0.01 * torch.where(torch.arange(N) % 2 == 0, 1.0, -1.0)
        if fault:
            w[torch.arange(N) % 20 < 2] = 1.0
        ln.weight.copy_(w)
    x = torch.randn(4, N)
    with opscope.dump(path, level="aten", overwrite=True) as d:
        ln(x).sum()
        d.step()


def test_a_weights_spread_alone_is_found_and_named(tmp_path):
    _layer_norm_run(tmp_path / "r", fault=False)
    _layer_norm_run(tmp_path / "t", fault=True)
    rows = [opscope.load(tmp_path / s).records(columns=["io", "param", "min", "max", "mean", "std"]).to_pylist()
            for s in ("t", "r")]
    wt, wr = ([r for r in side if r["param"] == "weight"][0] for side in rows)
    assert (wt["min"], wt["max"]) == (wr["min"], wr["max"]) and abs(wt["mean"] - wr["mean"]) < 1e-7
    assert wt["std"] < 0.96 * wr["std"]
    result = opscope.compare(tmp_path / "t", tmp_path / "r", workers=1)
    assert result.verdict == "diverged"
    first = result.first_divergence
    assert (first.op, first.io, first.param) == ("aten.native_layer_norm.default", "param", "weight")


def test_stds_are_exact_only_where_both_dumps_say_so():
    new, old = {"std": STD_METHOD}, {}
    assert stds_exact(new, new)
    assert not stds_exact(new, old) and not stds_exact(old, new) and not stds_exact(old, old)
    assert not stds_exact({"std": "sumsq"}, {"std": "sumsq"})
