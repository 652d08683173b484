"""opscope.tensorflow's profile on real TensorFlow / Keras runs, read back through the real CLI.

One subprocess (TensorFlow imports once) trains small Keras models under the profile:
``fit`` twice with the same code, once with an expensive custom gradient (slow backward),
once with a slow input pipeline; a custom loop (tf.function, ``p.step()``) with a slow
pipeline; ``fit(run_eagerly=True)``; a profile configured through Ascend's
``profiling_options``; and an ``fp_point`` that names no layer. Each run's files are then
read by ``opscope profile show`` / ``diff``, and the report opens in headless Chromium.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from collections import Counter

import pytest

pytest.importorskip("tensorflow")
pq = pytest.importorskip("pyarrow.parquet")

TRAIN = textwrap.dedent(
    """
    import json, os, sys, time
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import numpy as np, tensorflow as tf, keras
    from opscope.errors import ConfigError
    from opscope.tensorflow import profile

    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    root = sys.argv[1]
    out = {}

    def slow_gradient(n):
        @tf.custom_gradient
        def op(x):
            def grad(dy):
                z = tf.eye(384) * (1.0 + 1e-9 * tf.reduce_mean(dy))  # depends on dy: not folded
                for _ in range(n):
                    z = tf.matmul(z, z)
                return dy + 0.0 * tf.reduce_mean(z)
            return tf.identity(x), grad
        return op

    class SlowBackward(keras.layers.Layer):
        def __init__(self, n, **kw):
            super().__init__(**kw)
            self.op = slow_gradient(n) if n else None
        def call(self, x):
            return self.op(x) if self.op is not None else x

    def model(extra_matmuls=1, eager=False, **compile_keys):
        keras.utils.set_random_seed(0)
        inp = keras.Input((32,))
        h = keras.layers.Dense(128, activation="relu", name="hidden")(inp)
        h = SlowBackward(extra_matmuls, name="tap")(h)
        out = keras.layers.Dense(10, name="head")(h)
        m = keras.Model(inp, out)
        m.compile(optimizer=keras.optimizers.Adam(1e-3), run_eagerly=eager, **compile_keys,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return m

    def data(steps, sleep=0.0):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(steps * 16, 32)).astype("float32")
        y = rng.integers(0, 10, steps * 16).astype("int32")
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
        if sleep:
            pause = lambda a: (time.sleep(sleep), a)[1]
            ds = ds.map(lambda a, b: (tf.ensure_shape(tf.numpy_function(pause, [a], tf.float32), [None, 32]), b))
        return ds

    weights = []

    def fit(name, steps=16, sleep=0.0, epochs=1, validation=None, **kw):
        p = profile(f"{root}/{name}", steps="5-6", task_trace=True, overwrite=True)
        m = model(**kw)
        m.fit(data(steps, sleep), epochs=epochs, verbose=0, callbacks=[p], validation_data=validation)
        out[name] = {"status": p.result.status, "warnings": p.result.warnings}
        weights[:] = [w.numpy() for w in m.weights]

    def same_weights(bare, observed):
        pairs = zip(bare.weights, observed)
        return len(bare.weights) == len(observed) and all(np.array_equal(a.numpy(), b) for a, b in pairs)

    # bfloat16 first: a fused MatMul+BiasAdd rounds differently, so a mark that stopped a
    # Grappler fusion would change the numbers here.
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    bare = model(extra_matmuls=0)
    bare.fit(data(8), epochs=1, verbose=0)
    fit("bf16", steps=8, extra_matmuls=0)
    out["bit_exact_bf16"] = same_weights(bare, weights)
    keras.mixed_precision.set_global_policy("float32")
    bare = model()
    bare.fit(data(16), epochs=1, verbose=0)
    fit("base")
    out["bit_exact"] = same_weights(bare, weights)
    fit("same")
    fit("slowbwd", extra_matmuls=12)
    fit("slowdata", sleep=0.03)
    fit("eager", steps=10, eager=True, steps_per_execution=2)  # a Python loop of 2 batches a call

    from tensorflow.python.eager import context

    def step_ops(m):  # the op types of one train-function call's largest graph, as Grappler left it
        m.make_train_function(force=True)
        context.context().enable_run_metadata()
        try:
            m.train_function(iter(data(4).repeat()))
            graphs = context.context().export_run_metadata().function_graphs
        finally:
            context.context().disable_run_metadata()
        return [n.op for n in max((f.post_optimization_graph for f in graphs), key=lambda g: len(g.node)).node]

    out["ops_bare"] = step_ops(model())
    with profile(f"{root}/opcount", overwrite=True):
        out["ops_profiled"] = step_ops(model())

    fit("xla", steps=8, extra_matmuls=0, jit_compile=True)  # a custom gradient is no XLA op
    fit("spe", steps=8, epochs=2, validation=data(3), steps_per_execution=4)  # validation after each epoch

    m = model()
    opt, loss_fn = m.optimizer, m.loss

    @tf.function
    def train_step(a, b):
        with tf.GradientTape() as tape:
            loss = loss_fn(b, m(a, training=True))
        grads = tape.gradient(loss, m.trainable_variables)
        opt.apply_gradients(zip(grads, m.trainable_variables))
        return loss

    with profile(f"{root}/loop", steps="4", task_trace=True, overwrite=True) as p:
        for a, b in data(12, sleep=0.03):
            train_step(a, b)
            p.step()

    # Zero-code (opscope run / OPSCOPE_CONFIG start it so): no callback, no p.step().
    from opscope.config import profile_config
    from opscope.profile.tensorflow import start_profile
    session = start_profile(profile_config({"profile": {"output": f"{root}/zerocode", "overwrite": True}}))
    m = model()
    m.fit(data(6), epochs=1, verbose=0)
    opt2, loss2 = m.optimizer, m.loss

    @tf.function
    def plain_step(a, b):
        with tf.GradientTape() as tape:
            loss = loss2(b, m(a, training=True))
        opt2.apply_gradients(zip(tape.gradient(loss, m.trainable_variables), m.trainable_variables))

    for a, b in data(5):
        plain_step(a, b)
    out["zerocode"] = {"status": session.stop().status, "steps": len(session.rows)}

    options = json.dumps({"output": f"{root}/ascend", "training_trace": "on", "task_trace": "on",
                          "fp_point": "", "bp_point": "", "aicpu": "on"})
    p = profile(config={"profile": {"profiling_mode": True, "profiling_options": options, "steps": "3"}})
    model().fit(data(8), epochs=1, verbose=0, callbacks=[p])

    try:
        p = profile(f"{root}/badpoint", fp_point="no_such_layer", overwrite=True)
        model().fit(data(6), epochs=1, verbose=0, callbacks=[p])
        out["badpoint"] = "no error"
    except ConfigError as exc:
        out["badpoint"] = str(exc)
    print(json.dumps(out))
    """
)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def opscope_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "opscope", "profile", *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tfprof")
    script = root / "train_tf.py"
    script.write_text(TRAIN)
    done = subprocess.run([sys.executable, str(script), str(root)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return root, json.loads(done.stdout.strip().splitlines()[-1])


def steady(folder, skip=2):
    rows = pq.read_table(folder / "steps.parquet").to_pylist()
    return [r for r in rows if r["step"] >= skip and not r["task_trace"] and r["complete"]]


def median(values):
    values = sorted(values)
    return values[len(values) // 2]


def test_phases_add_up_and_every_phase_is_seen(runs) -> None:
    root, out = runs
    assert out["base"]["status"] == "complete" and out["base"]["warnings"] == []
    rows = pq.read_table(root / "base" / "steps.parquet").to_pylist()
    assert [r["step"] for r in rows] == list(range(16)), "one step per batch of fit"
    for r in rows:
        parts = sum(
            r[f"{p}_ns"]
            for p in ("data_wait", "forward", "backward", "communication", "optimizer", "zero_grad", "other")
        )
        assert parts == r["wall_ns"], "exclusive phases sum to the step's wall time exactly (integer ns)"
    for r in steady(root / "base"):
        assert r["forward_ns"] > 0 and r["backward_ns"] > 0 and r["optimizer_ns"] > 0, r


def test_profiling_does_not_change_the_numbers(runs) -> None:
    _, out = runs
    assert out["bit_exact"], (
        "weights after a fit with the profile (marks, and the task trace on 2 steps) equal a bare fit's, bit for bit"
    )
    assert out["bit_exact_bf16"], "the same under mixed_bfloat16, where a stopped fusion would round differently"


def test_phase_marks_agree_with_tensorflows_own_op_trace(runs) -> None:
    """The task trace times every op on TensorFlow's clock; the training trace's phases must
    hold them: gradient ops in backward, the model's forward ops in forward, Adam in optimizer."""
    root, _ = runs
    ops = pq.read_table(root / "base" / "rank0" / "ops.parquet").to_pylist()
    # the marks are read after the profiler stops: opscope's own eager reads are not the step's ops
    ours = {o["name"] for o in ops} & {"EagerLocalExecute: ReadVariableOp", "EagerLocalExecute: Identity"}
    assert not ours, ours
    share: dict[tuple[str, str], float] = {}
    for op in ops:
        name = op["name"]
        if name.endswith(":ReadVariableOp"):
            # a weight's read depends on nothing the forward_start mark orders: TensorFlow's
            # executor may run it as the step begins, before the mark (up to 10% of this small
            # model's forward time on a loaded machine, in no phase)
            continue
        kind = (
            "backward"
            if name.startswith("gradient_tape/")
            else "optimizer"
            if re.match(r"adam(_\d+)?/", name)
            else "forward"
            if name.startswith("functional")
            else None
        )
        if kind:
            share[(kind, op["phase"])] = share.get((kind, op["phase"]), 0.0) + op["self_us"]
    for kind in ("forward", "backward", "optimizer"):
        total = sum(v for (k, _), v in share.items() if k == kind)
        assert total > 0, (kind, share)
        assert share.get((kind, kind), 0.0) >= 0.9 * total, (kind, share)


def test_the_marks_add_a_few_ops_to_the_step_and_take_none_away(runs) -> None:
    """What the training trace costs a step is the ops it adds: timestamps and their writes.
    Grappler leaves the rest as in the bare step (no fusion or folding lost), and no identity
    per captured input appears (session 13: fit's loop and step shared the marks variable, and
    the control edge that made turned into ~110 identities once the step was inlined)."""
    _, out = runs
    bare, marked = Counter(out["ops_bare"]), Counter(out["ops_profiled"])
    extra = marked - bare
    assert not bare - marked, bare - marked
    assert extra["Timestamp"] == 7 and extra["Identity"] <= 4, extra
    assert sum(extra.values()) <= 60, extra


def test_slow_input_pipeline_is_data_wait(runs) -> None:
    root, _ = runs
    for name in ("slowdata", "loop"):  # in fit (get_next inside the graph) and an eager loop
        rows = steady(root / name)
        assert len(rows) >= 5, name
        wait = median([r["data_wait_ns"] for r in rows])
        # A 30 ms sleep per batch; tf.data prefetches, so part of it overlaps the step.
        assert wait > 8e6, (name, wait)
        assert wait > 10 * median([r["data_wait_ns"] for r in steady(root / "base")]), name
        assert wait > 3 * median([r["forward_ns"] + r["backward_ns"] + r["optimizer_ns"] for r in rows]), name
    # tf.data's work is the data phase's wherever it ran beside the step: its iterator's, and its
    # map function's (the sleeping PyFunc, on tf.data's thread pool, when it ran in a traced step).
    ops = pq.read_table(root / "slowdata" / "rank0" / "ops.parquet").to_pylist()
    pipeline = [o for o in ops if o["name"].startswith("Iterator::") or "PyFunc" in o["name"]]
    assert any(o["name"].startswith("Iterator::Root::Prefetch::") for o in pipeline), ops
    assert all(o["phase"] == "data_wait" for o in pipeline), pipeline


def test_slow_custom_gradient_is_backward_and_named_in_the_ops_table(runs) -> None:
    root, _ = runs
    base = median([r["backward_ns"] for r in steady(root / "base")])
    slow = median([r["backward_ns"] for r in steady(root / "slowbwd")])
    assert slow > base + 3e6, (base, slow)
    fwd_base = median([r["forward_ns"] for r in steady(root / "base")])
    fwd_slow = median([r["forward_ns"] for r in steady(root / "slowbwd")])
    assert fwd_slow < fwd_base + 0.5 * (slow - base), "the slowdown lands in backward, not forward"
    ops = [o for o in pq.read_table(root / "slowbwd" / "rank0" / "ops.parquet").to_pylist() if o["phase"] == "backward"]
    # the custom gradient's 12 matmuls (outside the tape's own gradient ops) are named in every
    # step the task trace covers, and their summed self time holds most of the slowdown (a sum, not the top
    # row: one small op preempted on a loaded machine can outlast a single 0.5 ms matmul)
    steps = {o["step"] for o in ops}
    custom = {s: [o for o in ops if o["step"] == s and o["name"].split(":")[0].startswith("MatMul")] for s in steps}
    assert steps and all(len(rows) == 12 for rows in custom.values()), {s: len(r) for s, r in custom.items()}
    assert median([sum(o["self_us"] for o in rows) for rows in custom.values()]) * 1e3 > 0.5 * (slow - base)
    assert not [o for o in ops if o["name"].startswith("Iterator::")]  # tf.data's prefetch is not backward


def test_eager_fit_is_timed_by_host_marks(runs) -> None:
    root, out = runs
    assert out["eager"]["status"] == "complete"
    rows = steady(root / "eager")
    assert rows and all(r["forward_ns"] > 0 and r["backward_ns"] > 0 and r["optimizer_ns"] > 0 for r in rows), rows
    steps = [r["step"] for r in pq.read_table(root / "eager" / "steps.parquet").to_pylist()]
    assert steps == list(range(10)), "steps_per_execution=2 in eager fit: still a step per batch"


def test_xla_runs_and_says_what_is_not_split(runs) -> None:
    root, out = runs
    assert out["xla"]["status"] == "complete"
    assert any("XLA" in w and "jit_compile=False" in w for w in out["xla"]["warnings"]), out["xla"]
    rows = steady(root / "xla")
    assert rows and all(r["forward_ns"] == 0 and r["other_ns"] > 0 for r in rows)


def test_steps_per_execution_gives_a_step_per_batch(runs) -> None:
    """fit with steps_per_execution=4 runs four batches per call of its train function; each
    batch's marks are told apart: one step per batch, as with 1 (and as the dump counts). Two
    epochs of 8 batches, each followed by validation, which is no step (it used to swell the
    epoch's last step: the test function traced and run, ~100x a batch)."""
    root, out = runs
    assert out["spe"]["status"] == "complete", out["spe"]
    assert not any("steps_per_execution" in w for w in out["spe"]["warnings"]), out["spe"]
    rows = pq.read_table(root / "spe" / "steps.parquet").to_pylist()
    assert [r["step"] for r in rows] == list(range(16)), "one step per batch"
    assert {r["step"] for r in rows if r["task_trace"]} == {4, 5, 6, 7}, "steps 5-6: the call that ran them"
    inside = [(a, b) for a, b in zip(rows, rows[1:]) if b["step"] % 4]
    assert all(a["start_ns"] + a["wall_ns"] == b["start_ns"] for a, b in inside), "a call's batches tile it"
    spe, base = steady(root / "spe"), steady(root / "base")
    assert len(spe) >= 8 and all(r["forward_ns"] > 0 and r["backward_ns"] > 0 and r["optimizer_ns"] > 0 for r in spe)
    walls = sorted(r["wall_ns"] for r in spe)
    assert walls[-1] < 10 * walls[len(walls) // 2], ("no step holds the validation", walls)
    for phase in ("backward_ns", "optimizer_ns"):  # a batch's, not four summed (>= 4x); 2.05x seen under load
        assert median([r[phase] for r in spe]) < 3 * median([r[phase] for r in base]), phase
    ops = pq.read_table(root / "spe" / "rank0" / "ops.parquet").to_pylist()
    assert {o["step"] for o in ops} == {4, 5, 6, 7}
    for step in (4, 5, 6, 7):  # each batch's own ops, in their phases
        mine = [o for o in ops if o["step"] == step]
        assert {"forward", "backward", "optimizer"} <= {o["phase"] for o in mine}, step
        tape = [o for o in mine if o["name"].startswith("gradient_tape/")]
        share = sum(o["self_us"] for o in tape if o["phase"] == "backward") / sum(o["self_us"] for o in tape)
        assert share >= 0.9, (step, share)


def test_zero_code_start_finds_steps_without_callback_or_step_calls(runs) -> None:
    root, out = runs
    assert out["zerocode"] == {"status": "complete", "steps": 11}, out["zerocode"]  # 6 fit batches + 5 loop calls
    rows = steady(root / "zerocode", skip=7)  # the loop's steps after its first (tracing) call
    assert rows and all(r["forward_ns"] > 0 and r["backward_ns"] > 0 and r["optimizer_ns"] > 0 for r in rows), rows


def test_profiling_options_and_bad_points(runs) -> None:
    root, out = runs
    summary = json.loads((root / "ascend" / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["config"]["task_trace"] is True
    assert summary["steps"]["task_traced"] == 1 and "tensorflow" in summary
    assert "no_such_layer" in out["badpoint"] and "layer" in out["badpoint"]


def test_show_and_diff_read_tensorflow_profiles(runs) -> None:
    root, _ = runs
    done = opscope_cli("show", str(root / "base"))
    assert done.returncode == 0, done.stderr
    for word in ("status: complete", "forward", "backward", "optimizer", "MatMul", "Iterator::"):
        assert word in done.stdout, word
    done = opscope_cli("diff", str(root / "base"), str(root / "slowbwd"), "--json")
    assert done.returncode == 1, done.stdout
    result = json.loads(done.stdout)
    flagged = {c["name"]: c["direction"] for c in result["phases"] if c["direction"] != "same"}
    assert flagged.get("backward") == "slower", result["phases"]
    assert "MatMul" in (result["causes"].get("backward") or ""), result["causes"]
    done = opscope_cli("diff", str(root / "base"), str(root / "same"), "--json")
    assert done.returncode in (0, 1), done.stderr
    same = json.loads(done.stdout)
    assert "backward" not in {c["name"] for c in same["phases"] if c["direction"] == "slower" and c["delta_ms"] > 3}


@pytest.mark.skipif(
    not shutil.which("chromium") and not shutil.os.path.exists(CHROMIUM), reason="chromium not installed"
)
def test_report_of_a_tensorflow_profile_draws_in_headless_chromium(runs, tmp_path) -> None:
    root, _ = runs
    page = root / "base" / "report.html"
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'ud'}",
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    body = re.search(r"<body[^>]*>", done.stdout).group(0)
    assert 'data-chart="ok"' in body, done.stderr[-2000:]
    assert "data-error" not in body, body
    assert int(re.search(r'data-points="(\d+)"', body).group(1)) == 16
    assert "Uncaught" not in done.stderr
