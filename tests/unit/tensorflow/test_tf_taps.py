"""The dump's taps are kept out of Grappler's sight (capture/tensorflow/_c/tap_passes.cc): a
dumped tf.function computes what the same function computes without the dump, bit for bit and
run after run, through the statistics op and through the host callback; the tensors Grappler
rewrote away are recorded as absent, not as something else."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from opscope.capture.tensorflow import opbuild  # noqa: E402
from opscope.capture.tensorflow.session import TFDumpSession  # noqa: E402
from opscope.model.records import ABSENT_NOTE  # noqa: E402
from opscope.storage.reader import load  # noqa: E402
from opscope.tensorflow import resolve  # noqa: E402

STEPS = 3


def _train(path=None, data="statistics", loops=0):
    """Three steps of a graph with what Grappler regroups when no one else reads the parts: an
    Add chain over operands of two shapes and a product chain with a constant; and AddN of
    three, whose sum order follows the input buffer it may write into. ``loops``: that inside
    as many nested ``tf.while_loop`` (fit's ``steps_per_execution`` loop around a model's own
    loop is two). Returns the losses and the variables' bytes."""
    rng = np.random.default_rng(1)
    w = tf.Variable(rng.standard_normal((8, 16)).astype(np.float32))
    b1, b2 = (tf.Variable(rng.standard_normal(16).astype(np.float32)) for _ in range(2))
    x = tf.constant(rng.standard_normal((32, 8)).astype(np.float32))

    def update(x):
        with tf.GradientTape() as tape:
            h = tf.matmul(x, w)
            y = h * 0.3 + b1 + b2
            z = tf.add_n([y, tf.tanh(h), y * tf.nn.softmax(h) * 0.7])
            loss = tf.reduce_sum(z * z)
        grads = tape.gradient(loss, [w, b1, b2])
        for v, g in zip((w, b1, b2), grads):
            v.assign_sub(1e-3 * g)
        return loss

    def looped(body, depth):
        if depth == 0:
            return body
        inner = looped(body, depth - 1)
        return lambda x: tf.while_loop(lambda i, _: i < 2, lambda i, _: (i + 1, inner(x)),
                                       (tf.constant(0), tf.constant(0.0)))[1]

    step = tf.function(looped(update, loops))

    losses = []
    if path is None:
        losses = [step(x).numpy().tobytes() for _ in range(STEPS)]
    else:
        cfg, level = resolve(None, path, {"level": "op", "data": data, "steps": "all"})
        with TFDumpSession(cfg, level) as d:
            for _ in range(STEPS):
                losses.append(step(x).numpy().tobytes())
                d.step()
    return losses, [v.numpy().tobytes() for v in (w, b1, b2)]


def test_a_dumped_function_computes_the_bits_of_the_bare_one(tmp_path):
    assert opbuild.load() is not None, opbuild.error()
    bare = _train()
    assert _train(tmp_path / "op") == bare
    assert _train(tmp_path / "again") == bare  # and again: no race on who holds a buffer
    assert _train(tmp_path / "host", data="tensor") == bare  # the host callback's path


def test_the_merged_inner_add_is_absent_and_the_rest_is_measured(tmp_path):
    _train(tmp_path / "op")
    dump = load(tmp_path / "op")
    rows = dump.records(step=1).to_pandas()
    absent = rows[rows.note == ABSENT_NOTE]
    inner = rows[(rows.node == "add") & (rows.io == "output")]  # h * 0.3 + b1: merged with + b2
    chain = rows[(rows.node == "add_1") & (rows.io == "output")]  # the chain's sum: what ran
    assert len(inner) == 1 and inner.index[0] in absent.index, rows[["op", "node", "io", "note"]]
    assert absent[["min", "max", "mean", "norm", "nan", "hash"]].isna().all().all()
    assert chain.norm.notna().all() and chain.note.isna().all()
    assert 0 < len(absent) < 0.2 * len(rows) and rows.drop(absent.index).hash.notna().all()
    assert any("absent from the graph that ran" in n for n in dump.manifest["notes"])
    host = tmp_path / "host"
    _train(host, data="tensor")  # the host callback's path records the same values, the same absent ones
    theirs = load(host).records(step=1).to_pandas()
    assert rows.hash.equals(theirs.hash) and rows.note.equals(theirs.note)


def test_taps_in_a_loop_inside_a_loop_are_hidden_too(tmp_path):
    """fit with ``steps_per_execution`` > 1 runs the step in a while loop, and a model's own
    loop (an RNN layer's) is then a loop inside a loop: its taps too are kept out of
    Grappler's sight, and the inner Add it merged is absent there too."""
    bare = _train(loops=2)
    assert _train(tmp_path / "op", loops=2) == bare
    assert _train(tmp_path / "host", data="tensor", loops=2) == bare
    rows = load(tmp_path / "op").records(step=1).to_pandas()
    inner = rows[(rows.node == "while/while/add_1") & (rows.io == "output")]  # add: the loop's i + 1
    chain = rows[(rows.node == "while/while/add_2") & (rows.io == "output")]
    assert len(inner) == 4 and (inner.note == ABSENT_NOTE).all(), rows[["op", "node", "io", "note"]]
    assert len(chain) == 4 and chain.norm.notna().all()
