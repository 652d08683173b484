"""Integers whose statistics agree while their contents differ (a permutation: shuffled labels,
an index set in another order). Their hashes differ, and integers must match exactly: before
session 24 a statistics dump passed them ("within tolerance"), the labels of another batch
included."""

from __future__ import annotations

import numpy as np
import synth

import opscope

LABELS = np.array([3, 1, 4, 1, 5, 9, 2, 6])
SCORES = np.linspace(-1, 1, 40, dtype=np.float32).reshape(8, 5)


def run(path, labels: np.ndarray, order: np.ndarray | None = None) -> None:
    r = synth.Run(path, data="statistics")
    x = r.leaf(SCORES)
    (idx,) = r.op("aten.argsort.default", [x], [np.argsort(SCORES[:, 0]) if order is None else order],
                  dtype="int64")
    r.op("aten.nll_loss_forward.default", [x, r.leaf(labels, dtype="int64")], [np.array(1.0)], dtype="float32")
    r.op("aten.index_select.default", [x, idx], [SCORES[idx.value]])
    r.close()


def test_shuffled_labels_are_a_root(tmp_path) -> None:
    run(tmp_path / "t", LABELS[::-1].copy())
    run(tmp_path / "r", LABELS)
    result = opscope.compare(tmp_path / "t", tmp_path / "r")
    first = result.first_divergence
    assert first is not None and (first.kind, first.op, first.slot, first.dtype) == (
        "root", "aten.nll_loss_forward.default", 1, "int64"), result.culprits


def test_an_index_op_that_returns_another_order_is_a_culprit(tmp_path) -> None:
    run(tmp_path / "t", LABELS, order=np.argsort(SCORES[:, 0])[::-1].copy())
    run(tmp_path / "r", LABELS)
    result = opscope.compare(tmp_path / "t", tmp_path / "r")
    assert [(f.kind, f.op) for f in result.culprits][:1] == [("culprit", "aten.argsort.default")], result.culprits
