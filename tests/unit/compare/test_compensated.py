"""A one-sided op whose difference the other side makes up for is no culprit; an inserted
op whose difference reaches the end is (verdict pass ``forgive_compensated``).

The attention scores of PyTorch's math SDPA (q * sqrt(s)) @ (k * sqrt(s))^T against eager
attention's (q @ k^T) * s, then a softmax: the same scores, two one-sided scalings on one
side and one on the other."""

import numpy as np
import pytest
import synth

import opscope

SCALE = 0.125


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _attention(path, how: str, dtype: str = "float32"):
    """Scores of 4 queries on 6 keys, softmax, then a weighted sum of v; ``how``: eager, math
    (the scale split over q and k), fault (eager, q scaled by 0.5 before the matmul)."""
    rng = np.random.default_rng(0)
    x0, wq, wk, v0 = (rng.standard_normal(shape) for shape in ((4, 8), (8, 8), (8, 8), (6, 8)))
    run = synth.Run(path)
    for _ in range(2):
        x, v = run.leaf(x0, dtype), run.leaf(v0, dtype)
        wq_, wk_ = run.leaf(wq, dtype, param="q.weight"), run.leaf(wk, dtype, param="k.weight")
        (q,) = run.op("aten.mm.default", [x, wq_], [x.value.astype(np.float64) @ wq_.value], module="q")
        (k,) = run.op("aten.mm.default", [v, wk_], [v.value.astype(np.float64) @ wk_.value], module="k")
        (kt,) = run.op("aten.t.default", [k], [k.value.T], module="attn")
        if how == "fault":  # inserted before the eager attention's matmul
            (q,) = run.op("aten.mul.Scalar", [q], [q.value.astype(np.float64) * 0.5], module="attn")
        if how in ("eager", "fault"):
            (s,) = run.op("aten.mm.default", [q, kt], [q.value.astype(np.float64) @ kt.value], module="attn")
            (s,) = run.op("aten.mul.Scalar", [s], [s.value.astype(np.float64) * SCALE], module="attn")
        else:
            factor = np.sqrt(SCALE)
            (q,) = run.op("aten.mul.Scalar", [q], [q.value.astype(np.float64) * factor], module="attn")
            (kt,) = run.op("aten.mul.Scalar", [kt], [kt.value.astype(np.float64) * factor], module="attn")
            (s,) = run.op("aten.mm.default", [q, kt], [q.value.astype(np.float64) @ kt.value], module="attn")
        (p,) = run.op("aten._softmax.default", [s], [_softmax(s.value.astype(np.float64))], module="attn")
        (o,) = run.op("aten.mm.default", [p, v], [p.value.astype(np.float64) @ v.value], module="attn")
        run.op("aten.sum.default", [o], [np.asarray(o.value.astype(np.float64).sum())])
        run.end_step()
    run.close()
    return path


@pytest.fixture(scope="module")
def eager(tmp_path_factory):
    return _attention(tmp_path_factory.mktemp("eager") / "d", "eager")


def test_a_scale_moved_across_the_matmul_is_no_culprit(tmp_path, eager):
    result = opscope.compare(_attention(tmp_path / "math", "math"), eager, workers=1)
    assert result.verdict == "within_tolerance", [c.where for c in result.culprits]
    table = result.pairs_table.to_pandas()
    forgiven = table[(table.kind == "identity") & (table.side == "target")]
    assert len(forgiven) == 4 and set(forgiven.status) == {"passed"}  # q's and k's scaling, 2 steps
    assert forgiven.note.str.contains("gone again at aten._softmax.default").all()
    assert table.status.ne("failed").all()  # what carried the difference to the softmax passes too


def test_an_inserted_scale_that_reaches_the_end_is_named(tmp_path, eager):
    result = opscope.compare(_attention(tmp_path / "fault", "fault"), eager, workers=1)
    first = result.first_divergence
    assert result.verdict == "diverged"
    assert (first.kind, first.op, first.step) == ("culprit", "aten.mul.Scalar", 0), first.where
    assert "judged as an identity" in first.note
