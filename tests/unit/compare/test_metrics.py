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
