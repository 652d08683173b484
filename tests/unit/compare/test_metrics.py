import math

import numpy as np
import pytest

from opscope.compare import metrics as M
from opscope.compare.accumulate import CHUNK, accumulate


def _measure(a, b, **kw):
    return M.finish(accumulate(a, b, rel_floor=kw.get("rel_floor", 1e-3), rtol=kw.get("rtol", 1e-3)))


def test_metrics_match_numpy_over_chunk_boundaries():
    rng = np.random.default_rng(0)
    b = rng.standard_normal(CHUNK * 2 + 123).astype(np.float32)
    a = (b + 1e-3 * rng.standard_normal(b.size)).astype(np.float32)
    m = _measure(a, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    d = a64 - b64
    assert m["max_abs"] == pytest.approx(np.abs(d).max())
    assert m["mean_abs"] == pytest.approx(np.abs(d).mean())
    assert m["rmse"] == pytest.approx(np.sqrt((d * d).mean()))
    assert m["rel_l2"] == pytest.approx(np.linalg.norm(d) / np.linalg.norm(b64))
    assert m["cosine"] == pytest.approx(a64 @ b64 / np.linalg.norm(a64) / np.linalg.norm(b64))
    assert m["snr_db"] == pytest.approx(10 * np.log10((b64 @ b64) / (d @ d)))
    floor = 1e-3
    rel = np.abs(d) / np.maximum(np.abs(b64), floor)
    assert m["max_rel"] == pytest.approx(rel.max())
    assert m["out_of_tolerance"] == pytest.approx((rel > 1e-3).mean())


def test_near_zero_reference_does_not_explode_relative_error():
    b = np.array([1.0, 1e-30, -1.0], np.float32)
    a = np.array([1.0, 1e-6, -1.0], np.float32)
    assert _measure(a, b, rel_floor=1e-3)["max_rel"] == pytest.approx(1e-3, rel=1e-3)


def test_nan_and_inf_mismatches_are_counted_and_finite_part_measured():
    b = np.array([1.0, 2.0, np.nan, 4.0, 5.0], np.float32)
    a = np.array([1.0, np.inf, np.nan, np.nan, 5.5], np.float32)
    m = _measure(a, b)
    assert m["nan_mismatch"] == 1 and m["inf_mismatch"] == 1
    assert m["max_abs"] == pytest.approx(0.5)


def test_register_metric_refuses_duplicates_and_supports_per_chunk():
    with pytest.raises(ValueError, match="already registered"):
        M.register_metric("cosine")(lambda s: 0.0)

    @M.register_metric("test_max_target", per_chunk=True, combine="max")
    def _max_target(a, b):
        return float(np.max(a))

    try:
        a = np.arange(CHUNK * 3, dtype=np.float32)
        assert _measure(a, a)["test_max_target"] == a.max()
    finally:
        M.unregister_metric("test_max_target")
    assert "test_max_target" not in M.METRICS


def test_statistics_give_a_lower_bound_of_the_l2_error():
    rng = np.random.default_rng(1)
    b = rng.standard_normal(1000)
    a = b.copy()
    a[10] += 3.0

    def stats(x):
        return {"numel": x.size, "norm": np.linalg.norm(x), "mean": x.mean(), "std": x.std(),
                "min": x.min(), "max": x.max(), "absmax": np.abs(x).max(), "nan": 0, "inf": 0}

    s = M.from_statistics(stats(a), stats(b))
    true = np.linalg.norm(a - b)
    assert s.lower_bound and 0 < s.diff_norm <= true + 1e-12
    assert M.finish(s)["rel_l2"] <= true / np.linalg.norm(b)
    assert math.isnan(M.finish(s)["max_rel"])



def _row(t, overflowed=False):
    """A record's statistics as the dump writes them (the capture's own C kernel); with
    ``overflowed``, as dumps written before float32 sums that overflow were redone in float64
    wrote them: norm inf, mean -inf, std NaN, with no Inf element counted."""
    from opscope.capture.torch.stats import cpu_stats, dtype_name

    mn, mx, mean, std, norm, absmax, nan, inf, _zeros, _ = cpu_stats(t)
    if overflowed:
        norm, mean, std = math.inf, -math.inf, math.nan
    return {"numel": t.numel(), "dtype": dtype_name(t.dtype), "norm": norm, "mean": mean, "std": std,
            "min": mn, "max": mx, "absmax": absmax, "nan": nan, "inf": inf}


@pytest.mark.parametrize("overflowed", [False, True], ids=["now", "older dumps"])
@pytest.mark.parametrize("shape", [(), (16, 16)])
def test_mask_of_the_dtype_lowest_value_is_judged_on_its_magnitude(shape, overflowed):
    """Hugging Face fills attention masks with torch.finfo(dtype).min: -3.40e38 in float32,
    -3.39e38 in bfloat16 (0.4% apart, one bf16 rounding). Float32 sums of such values overflow;
    before the fix their norm (inf, with no Inf element) made the error inf, and a bf16 model
    against its float32 run named the mask's scalar_tensor as the culprit."""
    torch = pytest.importorskip("torch")

    def mask(dtype, value=None):
        fill = torch.finfo(dtype).min if value is None else value
        causal = torch.ones(shape, dtype=torch.bool).triu(1) if shape else torch.tensor(True)
        x = torch.where(causal, torch.tensor(fill, dtype=dtype), torch.tensor(0.0, dtype=dtype))
        return _row(x, overflowed)

    same = M.finish(M.from_statistics(mask(torch.bfloat16), mask(torch.float32)))
    assert math.isfinite(same["rel_l2"]) and same["rel_l2"] < 2.0**-7  # one bf16 rounding
    moved = M.finish(M.from_statistics(mask(torch.float32, -1e38), mask(torch.float32)))
    # -1e38 against -3.4e38 (0.7 apart): the norms show it; older dumps' extremes alone still
    # put it far beyond a rounding
    assert moved["rel_l2"] > (4 * 2.0**-7 if overflowed else 0.5)


def test_scores_masked_with_minus_inf_are_judged_on_their_finite_extremes():
    """Longformer fills its sliding-window scores with -inf and reads the chunked tensor whole:
    both sides hold the same Infs, so norm, mean and std are infinite or NaN on both and only
    the finite maximum's shift is known. It was measured against a norm of 0 (an infinite
    error): a bf16 model against its float32 run named the read a root. Now the shift is
    relative to the largest finite extreme: one bf16 rounding passes, a changed score does not."""
    torch = pytest.importorskip("torch")
    scores = torch.randn(4, 16, 2, 5, generator=torch.Generator().manual_seed(0)) * 0.03
    scores[:, :3, :, :2] = -math.inf
    rounded = M.finish(M.from_statistics(_row(scores.bfloat16()), _row(scores)))
    assert math.isfinite(rounded["rel_l2"]) and rounded["rel_l2"] <= 2.0**-8
    changed = scores.clone()
    changed[changed == changed.max()] *= 1.5
    assert M.finish(M.from_statistics(_row(changed), _row(scores)))["rel_l2"] >= 0.3
