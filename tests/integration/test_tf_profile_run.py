"""Zero-code TensorFlow profile: ``opscope run -c cfg.json -- python train_tf.py`` with the
seeds' ``profiling_options`` in the profile section, and a script that never mentions opscope."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("tensorflow")
pq = pytest.importorskip("pyarrow.parquet")

SCRIPT = textwrap.dedent(
    """
    import os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import numpy as np, tensorflow as tf, keras
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    keras.utils.set_random_seed(0)
    inp = keras.Input((32,))
    out = keras.layers.Dense(10)(keras.layers.Dense(64, activation="relu")(inp))
    model = keras.Model(inp, out)
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=int(sys.argv[1]))
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(160, 32)).astype("float32"), rng.integers(0, 10, 160).astype("int32")
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=1, verbose=0)
    """
)


@pytest.mark.parametrize("spe", [1, 4])
def test_opscope_run_profiles_a_keras_script_with_profiling_options(tmp_path, spe) -> None:
    """With steps_per_execution=4 the 10 batches run in calls of 4, 4 and 2: still a step per
    batch (the profile joins fit's callbacks), and step 3 traces the call that ran it."""
    (tmp_path / "train_tf.py").write_text(SCRIPT)
    options = {"output": "prof", "training_trace": "on", "task_trace": "on", "fp_point": "", "bp_point": ""}
    config = {"profile": {"profiling_options": json.dumps(options), "steps": "3"}}
    (tmp_path / "cfg.json").write_text(json.dumps(config))
    done = subprocess.run(
        [sys.executable, "-m", "opscope", "run", "-c", "cfg.json", "--", sys.executable, "train_tf.py", str(spe)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "profile (training trace, task trace, step 3) -> prof" in done.stderr
    summary = json.loads((tmp_path / "prof" / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["steps"]["task_traced"] == (1 if spe == 1 else 4)
    assert not summary["warnings"], summary["warnings"]
    rows = pq.read_table(tmp_path / "prof" / "steps.parquet").to_pylist()
    assert [r["step"] for r in rows] == list(range(10)), "a step per batch (10 batches)"
    steady = [r for r in rows if r["step"] >= 2]
    assert all(r["forward_ns"] > 0 and r["backward_ns"] > 0 and r["optimizer_ns"] > 0 for r in steady), steady
    assert (tmp_path / "prof" / "report.html").is_file()


FULL = textwrap.dedent(
    """
    import resource, signal, sys
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))  # files over 20 kB: EFBIG
    import os
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import numpy as np, tensorflow as tf, keras
    from opscope.errors import ProfileError
    from opscope.tensorflow import profile
    keras.utils.set_random_seed(0)
    inp = keras.Input((32,))
    model = keras.Model(inp, keras.layers.Dense(10)(keras.layers.Dense(128)(inp)))
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(160, 32)).astype("float32"), rng.integers(0, 10, 160).astype("int32")
    try:
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=1, verbose=0,
                  callbacks=[profile(sys.argv[1], task_trace=True, steps="5")])
    except ProfileError as exc:
        print("PROFILE ERROR:", exc)
        sys.exit(3)
    """
)


def test_a_full_disk_is_a_clear_error_and_keeps_the_steps(tmp_path) -> None:
    """TensorFlow's profiler cannot write the task-traced step's trace (a file-size limit):
    training runs to its end, then one clear error names the incomplete profile, and the
    step table of every batch is on disk (it used to end in TensorFlow's 'No profiler is
    running', raised by a second stop of the same step)."""
    (tmp_path / "full.py").write_text(FULL)
    done = subprocess.run([sys.executable, "full.py", str(tmp_path / "prof")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stdout + done.stderr[-3000:]
    assert "is incomplete" in done.stdout and "check free space" in done.stdout, done.stdout
    assert "task trace of step(s) [5]" in done.stdout and "No profiler is running" not in done.stderr
    rows = pq.read_table(tmp_path / "prof" / "rank0" / "steps.parquet").to_pylist()  # the rank's own table
    assert [r["step"] for r in rows] == list(range(10))


# SCRIPT's model and data (steps_per_execution 1, 64 samples), then a with-block around fit
BLOCK = SCRIPT.replace("int(sys.argv[1])", "1").replace("160", "64").split("model.fit(")[0] + textwrap.dedent(
    """
    import opscope.tensorflow as otf
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    with otf.profile(sys.argv[1], overwrite=True):  # no callback: a with-block around fit
        model.fit(ds, epochs=3, verbose=0, validation_data=ds.take(2) if sys.argv[2] == "val" else None)
    assert keras.Model.fit.__name__ != "joined_fit", "fit is itself again after the profile"
    """
)


def test_a_with_block_profile_around_fit_counts_no_validation_batch(tmp_path) -> None:
    """fit's validation batches are no training steps under a with-block profile either (they
    were: 18 steps for 12 batches, one of them holding the test function's tracing)."""
    (tmp_path / "block.py").write_text(BLOCK)
    steps = {}
    for mode in ("val", "noval"):
        done = subprocess.run([sys.executable, "block.py", str(tmp_path / mode), mode], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        steps[mode] = [r["step"] for r in pq.read_table(tmp_path / mode / "steps.parquet").to_pylist()]
    assert steps["val"] == steps["noval"] == list(range(12))
