"""Equal hashes are taken as bit-exact only when both dumps declare a hash that can bear it.

The case met on a Mixtral MoE: two runs whose only difference is a routing mask where one
token's top-2 experts swap order. Its wsum64-v1 hashes are equal, and compare used to call
the masks identical and blame the next op.
"""

from __future__ import annotations

import numpy as np
import pytest
import synth

import opscope
from opscope.compare.measure import hashes_comparable
from opscope.model.hashing import wsum64_v1


def routed_run(path, *, swap: bool, data: str = "tensor", **hashing) -> object:
    """logits -> one_hot(top-2) -> mask-weighted sum; with ``swap`` token 4's experts swap order."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((64, 5)).astype(np.float32)
    top = np.argsort(-logits, axis=1)[:, :2]
    top[4] = (2, 1) if swap else (1, 2)
    mask = np.eye(5, dtype=np.int64)[top]  # [64, 2, 5]: ones at words 82, 94 or 84, 92
    weights = np.array([1.0, 0.5], dtype=np.float32)
    run = synth.Run(path, data=data, **hashing)
    x = run.leaf(logits)
    (m,) = run.op("aten.one_hot.default", [x], [mask], module="router", dtype="int64")
    run.op("aten.einsum.default", [m, x], [np.einsum("tke,k,te->te", mask, weights, logits)],
           module="experts", dtype="float32")
    run.end_step()
    run.close()
    return path


def _mask_pair(result) -> dict:
    rows = [r for r in result.pairs_table.to_pylist() if r["op"] == "aten.one_hot.default" and r["io"] == "output"]
    assert len(rows) == 1
    return rows[0]


def test_swapped_routing_mask_is_not_called_identical(tmp_path):
    a = routed_run(tmp_path / "a", swap=False)
    b = routed_run(tmp_path / "b", swap=True)
    result = opscope.compare(b, a, workers=1)
    assert result.verdict == "diverged"
    assert _mask_pair(result)["mode"] == "tensor"  # different v2 hashes: the masks were read
    first = result.first_divergence
    assert (first.module, first.op) == ("router", "aten.one_hot.default")


@pytest.mark.parametrize("data", ["tensor", "statistics"])
def test_v1_dumps_do_not_take_equal_hashes_as_proof(tmp_path, data):
    v1 = {"hash_algorithm": "wsum64-v1", "hasher": wsum64_v1}
    a = routed_run(tmp_path / "a", swap=False, data=data, **v1)
    b = routed_run(tmp_path / "b", swap=True, data=data, **v1)
    hashes = [opscope.load(d).records(columns=["op", "io", "hash"]).to_pylist() for d in (a, b)]
    masks = [next(r["hash"] for r in h if r["op"] == "aten.one_hot.default" and r["io"] == "output") for h in hashes]
    assert masks[0] == masks[1]  # the collision itself
    result = opscope.compare(b, a, workers=1)
    pair = _mask_pair(result)
    assert pair["mode"] == ("tensor" if data == "tensor" else "statistics")
    if data == "tensor":  # the statistics of a permuted mask are equal: only the tensors show it
        assert result.verdict == "diverged"
        assert result.first_divergence.op == "aten.one_hot.default"
    else:
        assert result.verdict != "identical"


def test_hashes_are_comparable_only_for_one_strong_algorithm():
    v1, v2 = {"hash_algorithm": "wsum64-v1"}, {"hash_algorithm": "wsum64-v2"}
    assert hashes_comparable(v2, v2)
    assert not hashes_comparable(v1, v1)
    assert not hashes_comparable(v1, v2)
    assert not hashes_comparable({}, {})
