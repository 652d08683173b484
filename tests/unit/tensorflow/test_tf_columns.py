"""A statistics dump's graph runs written from numpy columns (``stats_many`` with ``out``,
``columns.GraphColumns.stats_table``) hold exactly the rows the per-value tuples give
(``rows.StepRows.graph_rows``, the path of the watch and of tensor dumps)."""

from __future__ import annotations

import math

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from opscope.capture.tensorflow import stats as st  # noqa: E402
from opscope.capture.tensorflow.session import TFDumpSession  # noqa: E402
from opscope.storage.reader import load  # noqa: E402
from opscope.tensorflow import resolve  # noqa: E402


def _run(path, on_rows):
    """Two steps of a custom loop whose graph has an empty tensor (None statistics), a
    complex one (numpy's statistics), bfloat16, integers, constants and views."""
    w = tf.Variable(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), name="w")

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            y = tf.matmul(x, w)
            empty = tf.slice(y, [0, 0], [0, 3])
            c = tf.complex(y, 2.0 * y)
            low = tf.cast(tf.reshape(y, [-1]), tf.bfloat16)
            count = tf.math.count_nonzero(y > 0)
            loss = tf.reduce_mean(y * y) + tf.reduce_sum(empty) + tf.math.real(tf.reduce_sum(c)) * 1e-3 \
                + tf.cast(tf.reduce_max(low), tf.float32) + tf.cast(count, tf.float32) * 1e-2
        w.assign_sub(0.1 * tape.gradient(loss, w))
        return loss

    cfg, level = resolve(None, path, {"level": "op"})
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    losses = []
    with TFDumpSession(cfg, level, on_rows=on_rows) as d:
        for _ in range(2):
            losses.append(float(step(x)))
            d.step()
    return load(path), losses


def test_columns_write_the_rows_the_tuples_give(tmp_path):
    seen: list[int] = []
    by_columns, losses = _run(tmp_path / "columns", None)
    by_tuples, losses_rows = _run(tmp_path / "tuples", lambda rows: seen.append(len(rows)))
    assert sum(seen) > 0, "the second dump took the per-value path"
    assert losses == losses_rows
    for step in (0, 1):
        ours, theirs = by_columns.records(step=step), by_tuples.records(step=step)
        assert ours.schema.equals(theirs.schema) and ours.num_rows == theirs.num_rows > 40
        assert str(ours.to_pylist()) == str(theirs.to_pylist()), step
    _written_together(tmp_path / "columns")
    rows = by_columns.records(step=1).to_pandas()
    assert rows["min"].isna().any() and (rows.numel == 0).any(), "an empty tensor: None statistics"
    assert {"complex64", "bfloat16", "int64"} <= set(rows.dtype)


def _written_together(path):
    """Both steps' rows in one file of the rank's folder (the writer's batch), written with
    the TensorFlow tables' options: no dictionary pages, no column statistics."""
    import pyarrow.parquet as pq

    files = list((path / "rank0").glob("records-*-*-*.parquet"))
    assert files and not list(path.glob("rank0/step*/records-*.parquet"))
    steps = set()
    for f in files:
        meta = pq.ParquetFile(f).metadata
        columns = [meta.row_group(0).column(i) for i in range(meta.num_columns)]
        assert not any(c.is_stats_set or c.has_dictionary_page for c in columns)
        steps |= set(pq.read_table(f, columns=["step"]).column("step").to_pylist())
    assert steps == {0, 1}


def test_mixed_parts_of_a_batch_file_get_the_default_options(tmp_path):
    from opscope.capture.tensorflow.columns import PARQUET_OPTIONS
    from opscope.storage import writer as w

    class Part:
        parquet_options, batch_options, num_rows = PARQUET_OPTIONS, True, 3

    class Own:
        parquet_options, num_rows = {"use_dictionary": False}, 3

    assert w._batched(Part()) and not w._batched(Own()) and w._batched([[0]] * 3)
    assert w._batch_options([Part(), Part()]) == PARQUET_OPTIONS
    assert w._batch_options([Part(), [[0]]]) == {}


def test_many_columns_are_many_stats_by_column():
    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal(70_000).astype(np.float32), np.zeros(0, np.float32),
              np.asarray(np.float32(2.5)), np.array([1.0, np.nan]), np.array([np.inf, 1.0]),
              rng.integers(-3, 3, 500).astype(np.int8), (rng.standard_normal(4) + 1j).astype(np.complex64),
              rng.standard_normal((6, 6))[:, ::2], np.array([True, False])]
    stats, nulls = st.many_columns(arrays)
    counts = stats[6:].view(np.uint64)
    assert nulls is not None and nulls[:, 1].tolist() == [True] * 4 + [False, True] + [False] * 4
    for i, want in enumerate(st.many_stats(arrays)):
        got = [None if nulls[k, i] else (float(stats[k, i]) if k < 6 else int(counts[k - 6, i]))
               for k in range(10)]
        want = [w & 0xFFFFFFFFFFFFFFFF if k == 9 and w is not None else w for k, w in enumerate(want)]
        assert all(g == w or (isinstance(g, float) and math.isnan(g) and math.isnan(w))
                   for g, w in zip(got, want, strict=True)), (i, got, want)
