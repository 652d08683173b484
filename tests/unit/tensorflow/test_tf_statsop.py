"""The in-graph statistics op (``OpscopeStats``, capture/tensorflow/_c/stats_op.cc): a graph
dumped through it writes exactly the rows the host callback's arrays give, leaves the losses
bit-identical, and when it cannot be built the dump says so once and measures on the host."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from opscope.capture.tensorflow import opbuild  # noqa: E402
from opscope.capture.tensorflow.session import TFDumpSession  # noqa: E402
from opscope.storage.reader import load  # noqa: E402
from opscope.tensorflow import resolve  # noqa: E402


def _step_fn():
    """A custom loop's step whose graph holds every dtype the dump measures: the kernel's
    (float16/32/64, bfloat16, int8/16/32/64, uint8, bool) and others (complex, uint16), empty
    values (None statistics), NaN and Inf, scalars, constants and views."""
    w = tf.Variable(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), name="w")

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            y = tf.matmul(x, w)
            empty = tf.slice(y, [0, 0], [0, 3])
            c = tf.complex(tf.cast(y, tf.float64), 2.0 * tf.cast(y, tf.float64))
            low = tf.cast(tf.reshape(y, [-1]), tf.bfloat16)
            half = tf.cast(y * 3.0, tf.float16)
            ints = [tf.cast(y * 10.0, t) for t in (tf.int8, tf.uint8, tf.int16, tf.int32, tf.uint16)]
            positive = y > 0
            frozen = tf.stop_gradient(y)  # (tf.where's gradient would carry the NaN into w)
            bad = tf.math.log(tf.concat([frozen, -frozen, frozen - frozen], 0))  # NaN, -Inf
            inf = 1.0 / (frozen - frozen)
            count = tf.math.count_nonzero(positive)
            loss = tf.reduce_mean(y * y) + tf.reduce_sum(empty) \
                + tf.cast(tf.math.real(tf.reduce_sum(c)), tf.float32) * 1e-3 \
                + tf.cast(tf.reduce_max(low), tf.float32) + tf.cast(count, tf.float32) * 1e-2 \
                + tf.cast(tf.reduce_sum(half), tf.float32) * 1e-3 \
                + sum(tf.cast(tf.reduce_sum(tf.cast(i, tf.int32)), tf.float32) for i in ints) * 1e-4 \
                + tf.reduce_sum(tf.where(tf.math.is_finite(bad), bad, 0.0)) * 1e-3 \
                + tf.reduce_sum(tf.where(tf.math.is_finite(inf), inf, 0.0))
        w.assign_sub(0.1 * tape.gradient(loss, w))
        return loss
    return step


def _run(path):
    step = _step_fn()
    cfg, level = resolve(None, path, {"level": "op"})
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8 - 0.3
    losses = []
    with TFDumpSession(cfg, level) as d:
        for _ in range(2):
            losses.append(step(x).numpy().tobytes())
            d.step()
    ops = {op.type for op in step.get_concrete_function(x).graph.get_operations()}
    return load(path), losses, ops


def _same_rows(a, b):
    for step in (0, 1):
        ours, theirs = a.records(step=step), b.records(step=step)
        assert ours.schema.equals(theirs.schema) and ours.num_rows == theirs.num_rows > 60
        assert str(ours.to_pylist()) == str(theirs.to_pylist()), step


def _bare_losses():
    step = _step_fn()
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8 - 0.3
    return [step(x).numpy().tobytes() for _ in range(2)]


def test_the_op_writes_the_rows_of_the_host_path(tmp_path, monkeypatch):
    assert opbuild.load() is not None, opbuild.error()
    by_op, losses, ops = _run(tmp_path / "op")
    assert "OpscopeStats" in ops, "the graph measured on the host"
    monkeypatch.setattr(opbuild, "ENABLED", False)
    by_host, losses_host, ops_host = _run(tmp_path / "host")
    assert "OpscopeStats" not in ops_host
    _same_rows(by_op, by_host)
    assert losses == losses_host == _bare_losses()
    rows = by_op.records(step=1).to_pandas()
    assert rows["min"].isna().any() and (rows.numel == 0).any(), "an empty tensor: None statistics"
    assert {"complex128", "uint16", "bfloat16", "float16", "float64", "int8", "uint8", "int16", "int32", "int64",
            "bool"} <= set(rows.dtype)
    assert rows["nan"].gt(0).any() and rows["inf"].gt(0).any()


def test_a_failed_build_falls_back_to_the_host_path(tmp_path, monkeypatch, capsys):
    reference, losses, _ = _run(tmp_path / "op")
    monkeypatch.setattr(opbuild, "_STATE", {})  # as in a new process
    monkeypatch.setenv("CXX", "false")  # a compiler that fails: a real failed compile
    by_host, losses_host, ops = _run(tmp_path / "fallback")
    err = capsys.readouterr().err
    assert "OpscopeStats" not in ops and opbuild.load() is None
    notices = [line for line in err.splitlines() if "statistics op is not available" in line]
    assert len(notices) == 1 and "compiling stats_op.cc and tap_passes.cc failed" in notices[0], err
    assert "dumped steps may compute other bits" in notices[0]  # what losing the passes means
    assert not opbuild.target().exists()  # nothing left in the cache under that command's key
    _same_rows(reference, by_host)
    assert losses == losses_host


def test_a_second_copy_of_opscope_reuses_the_op(tmp_path):
    """The op's cache key hashes its sources, not where opscope lies (another venv, an editable
    checkout): the same op, unless a source changed."""
    import importlib.util
    import shutil
    from pathlib import Path

    copy = tmp_path / "elsewhere" / "opscope"
    shutil.copytree(Path(opbuild.__file__).parents[2], copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))

    def target() -> Path:  # opbuild.py of the copy, run from there
        spec = importlib.util.spec_from_file_location("opbuild_copy", copy / "capture" / "tensorflow" / "opbuild.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert str(module._SOURCES[0]).startswith(str(copy))
        return module.target()

    assert target() == opbuild.target()
    (copy / "capture" / "tensorflow" / "_c" / "stats_op.cc").write_text("// changed\n")
    assert target() != opbuild.target()
