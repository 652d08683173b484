"""TensorFlow / Keras dumps end to end: a tiny transformer trained by tf_train.py in a subprocess,
compared with the real CLI. Skipped when TensorFlow is not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorflow")

import opscope  # noqa: E402
from opscope.model.records import ABSENT_NOTE  # noqa: E402

TRAIN = Path(__file__).with_name("tf_train.py")
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
# bf16 dumps its four steps (steps 0 and 1 alone happened to round as without the dump, before session 12)
RUNS = {"a": [], "b": [], "bf16": ["--policy", "mixed_bfloat16", "--steps", "0|1|2|3"], "fault": ["--fault", "ff0a"],
        "custom": ["--loop", "custom"], "layer": ["--level", "layer"], "late": ["--steps", "1|3"],
        "spe": ["--spe", "2", "--steps", "0|1|2|3"]}
BARE = {"bare": [], "bare_bf16": ["--policy", "mixed_bfloat16"], "bare_custom": ["--loop", "custom"],
        "bare_spe": ["--spe", "2"]}  # no dump


def train(path: Path | str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(TRAIN), str(path), *args], capture_output=True, text=True,
                          timeout=300, env=ENV)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """Each run's dump folder; beside it, ``<name>.weights``: the SHA-1 of its trained weights
    (the BARE runs write only that). Runs share processes (TensorFlow's import was half the
    fixture's time): the bare ones one process that never imports opscope, the dumped ones two,
    "a" and "b" (the same run twice) in different ones."""
    root = tmp_path_factory.mktemp("tf")
    groups = [["a", "bf16", "custom", "late"], ["b", "fault", "layer", "spe"], list(BARE)]

    def run(group: list[str]) -> None:
        runs = [["-" if name in BARE else str(root / name), *{**RUNS, **BARE}[name],
                 "--weights", str(root / f"{name}.weights")] for name in group]
        spec = root / f"{group[0]}.runs.json"
        spec.write_text(json.dumps(runs))
        train("--runs", str(spec))
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(run, groups))
    return {name: root / name for name in {**RUNS, **BARE}}


def weights(dumps: dict[str, Path], name: str) -> str:
    return dumps[name].with_name(f"{name}.weights").read_text()


def compare(a: Path, b: Path, out: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "opscope", "compare", str(a), str(b), "-o", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return json.loads((out / "summary.json").read_text())


def test_dump_has_layers_phases_params_and_data_flow(dumps):
    dump = opscope.load(dumps["a"])
    assert dump.status == "complete" and dump.steps() == [0, 1]
    assert dump.manifest["level"] == "tf-op" and dump.manifest["hash_algorithm"] == "wsum64-v2"
    df = dump.records(step=0).to_pandas()
    assert set(df.phase) == {"forward", "backward", "optimizer"}
    matmul = df[(df.module == "ff0a") & (df.op == "tf.MatMul") & (df.phase == "forward")]
    assert set(matmul.io) == {"input", "param", "output"} and "ff0a/kernel" in set(matmul.param)
    assert {"attn0.query", "ln0a", "ff0b"} <= set(df[df.phase == "backward"].module)
    grads = df[df.io == "grad"]
    assert "ff0a/kernel" in set(grads.param) and set(grads.phase) == {"optimizer"}
    inputs = df[(df.io == "input") & df.producer.notna()]
    by_id = df.set_index("id")
    producer = by_id.loc[inputs.producer.astype(int)]
    assert (producer.io.values == "output").all()
    # the same value (NaN: a tensor of NaN, or absent on both)
    assert np.array_equal(producer.norm.values, inputs.norm.values, equal_nan=True)


def test_same_run_twice_is_identical(dumps, tmp_path):
    summary = compare(dumps["a"], dumps["b"], tmp_path / "c")
    assert summary["verdict"] == "identical", summary
    a, b = opscope.load(dumps["a"]), opscope.load(dumps["b"])
    for step in (0, 1):  # every record, the backward's sums of three or more included
        ours, theirs = a.records(step=step).to_pandas(), b.records(step=step).to_pandas()
        assert len(ours) > 1000 and ours["hash"].equals(theirs["hash"]) and ours["note"].equals(theirs["note"])


@pytest.mark.parametrize("dumped, bare", [("a", "bare"), ("b", "bare"), ("late", "bare"), ("layer", "bare"),
                                          ("bf16", "bare_bf16"), ("custom", "bare_custom"), ("spe", "bare_spe")])
def test_a_dumped_run_trains_the_very_weights_of_a_run_without_it(dumps, dumped, bare):
    """The dump observes and changes nothing: op level and layer level, float32 and
    mixed_bfloat16, fit and a custom tf.function loop (session 12: Grappler rewrote the dumped
    graph less, and AddN summed in another order when a tap still held one of its inputs)."""
    assert weights(dumps, dumped) == weights(dumps, bare)


def test_tensors_grappler_rewrote_are_absent_and_say_so(dumps):
    """The inner Add of LayerNormalization's chain, which Grappler merges into one AddN, is not
    in the graph that ran: its rows hold no statistics and the note; the chain's result is."""
    dump = opscope.load(dumps["a"])
    df = dump.records(step=1).to_pandas()
    absent = df[df.note == ABSENT_NOTE]
    inner = df[(df.node == "tiny_1/ln0a_1/add_1") & (df.io == "output")]
    out = df[(df.node == "tiny_1/ln0a_1/add_2") & (df.io == "output")]
    assert len(inner) == 1 and inner.index[0] in absent.index
    assert absent[["min", "max", "norm", "hash"]].isna().all().all()
    assert len(out) == 1 and out.norm.notna().all() and len(absent) < 0.05 * len(df)
    assert any("absent from the graph that ran" in n for n in dump.manifest["notes"])


def test_steps_not_selected_run_plain_and_count(dumps):
    """Steps 0 and 2 run fit's own train step (no host callback): step 1 is still the second
    batch, and its records are those of the run that dumped every step (same numbers)."""
    late, a = opscope.load(dumps["late"]), opscope.load(dumps["a"])
    assert late.status == "complete" and late.steps() == [1, 3]
    columns = ["phase", "module", "op", "io", "node", "shape", "hash", "min", "max", "mean", "norm"]
    ours, theirs = late.records(step=1).to_pandas()[columns], a.records(step=1).to_pandas()[columns]
    assert len(ours) > 1000 and ours.astype(str).equals(theirs.astype(str))


def test_steps_per_execution_dumps_each_step_as_fit_one_by_one(dumps):
    """fit with steps_per_execution=2 runs two steps in one call (a while loop in a graph):
    a statistics dump still has each step, with the records of fit taking one step a call
    (session 12: the loop's condition graph planned the dump's own op and the writer failed;
    its predicates are plumbing, not rows)."""
    spe, a = opscope.load(dumps["spe"]), opscope.load(dumps["a"])
    assert spe.status == "complete" and spe.steps() == [0, 1, 2, 3]
    columns = ["phase", "module", "op", "io", "node", "shape", "hash", "min", "max", "mean", "norm", "note"]
    for step in (0, 1):
        ours, theirs = spe.records(step=step).to_pandas()[columns], a.records(step=step).to_pandas()[columns]
        assert len(ours) > 1000 and ours.astype(str).equals(theirs.astype(str)), step
    assert len(spe.records(step=3)) == len(spe.records(step=1))  # step 0 also creates the optimizer's slots


def test_bf16_against_float32_is_within_tolerance(dumps, tmp_path):
    summary = compare(dumps["a"], dumps["bf16"], tmp_path / "c")
    assert summary["verdict"] == "within_tolerance" and not summary.get("culprits"), summary


def test_a_one_layer_fault_is_named_at_its_op_and_layer(dumps, tmp_path):
    summary = compare(dumps["a"], dumps["fault"], tmp_path / "c")
    first = summary["first_divergence"]
    assert summary["verdict"] == "diverged" and first["module"] == "ff0a" and first["phase"] == "forward", first


def test_custom_loop_against_fit(dumps, tmp_path):
    summary = compare(dumps["a"], dumps["custom"], tmp_path / "c")
    assert summary["verdict"] in ("identical", "within_tolerance"), summary


def test_layer_level_and_show_convert(dumps, tmp_path):
    dump = opscope.load(dumps["layer"])
    df = dump.records(step=1).to_pandas()
    assert dump.manifest["level"] == "tf-layer"
    assert {"Dense", "LayerNormalization", "Embedding"} <= set(df.op) and "ff0a" in set(df.module)
    show = subprocess.run([sys.executable, "-m", "opscope", "show", str(dumps["layer"])], capture_output=True,
                          text=True, timeout=120)
    assert show.returncode == 0 and "level=layer" in show.stdout and "steps 0-1" in show.stdout, show.stderr


def test_xla_does_not_crash_and_says_what_it_missed(tmp_path):
    proc = train(tmp_path / "x", "--loop", "custom", "--jit")
    dump = opscope.load(tmp_path / "x")
    assert dump.status == "complete" and dump.steps() == [0, 1]
    note = " ".join(dump.manifest["notes"])
    assert "train_step" in note and "jit_compile=False" in note and "jit_compile=True" in proc.stderr
    rows = dump.records(step=1).to_pandas()
    call = rows[rows.op == "tf.train_step"]
    assert len(call) == 3 and set(call.io) == {"input", "output"}  # x, y in; the loss out


def test_full_disk_is_a_clear_error_and_keeps_what_was_written(tmp_path):
    script = textwrap.dedent(f"""
        import resource, runpy, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))  # files over 300 kB: EFBIG
        sys.argv = ["tf_train.py", {str(tmp_path / 'd')!r}, "--data", "tensor", "--steps", "all"]
        runpy.run_path({str(TRAIN)!r}, run_name="__main__")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode != 0 and "disk is full" in proc.stderr and "free space" in proc.stderr, proc.stderr[-2000:]
    dump = opscope.load(tmp_path / "d")
    assert dump.status == "crashed" and dump.records().num_rows > 0


def test_an_unsupported_strategy_is_refused_before_anything_runs(tmp_path):
    script = textwrap.dedent(f"""
        import tensorflow as tf, keras, numpy as np, opscope.tensorflow as otf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
            model.compile(optimizer="sgd", loss="mse")
        model.fit(np.ones((8, 4)), np.ones((8, 2)), verbose=0,
                  callbacks=[otf.DumpCallback({str(tmp_path / 'd')!r})])
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode != 0 and "MirroredStrategy with 2 replicas" in proc.stderr, proc.stderr[-2000:]
    assert "one worker per process" in proc.stderr


WATCH = """
import sys
sys.path.insert(0, {where!r})
import tensorflow as tf, tf_train, opscope.tensorflow as otf
from opscope.errors import OverflowDetected
if {deterministic}:
    tf.config.experimental.enable_op_determinism()
args = tf_train.argparse.Namespace(policy=None, fault=None, nan={nan}, jit=False)
model = tf_train.build(args)
w = otf.watch(action="raise")
try:
    model.fit(*tf_train.data(), batch_size=16, epochs=1, verbose=0, shuffle=False, callbacks=[w.callback()])
    print("NO HIT")
except OverflowDetected as exc:
    e = exc.event
    print("HIT", e.op, e.module, e.phase, e.step, e.kind, [i.nan for i in e.inputs])
    print(exc)
"""


@pytest.mark.parametrize("deterministic", [False, True])
def test_watch_names_the_first_nan_op_its_layer_and_inputs(deterministic):
    """Also under TensorFlow's op determinism, whose sparse cross-entropy broadcasts a NaN that a
    select drops at every step: that is no hit (it was, session 12); the layer's NaN is."""
    def watch(nan: bool) -> str:
        script = WATCH.format(where=str(TRAIN.parent), deterministic=deterministic, nan=nan)
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=ENV)
        return proc.stdout + proc.stderr[-2000:]
    out = watch(nan=True)
    assert "HIT tf.SelectV2 ff0b forward 1 nan [0, 1, 0]" in out, out
    assert "first NaN/Inf" in out and "from tf.GreaterEqual in ff0b" in out
    if deterministic:
        assert "NO HIT" in watch(nan=False)


def test_zero_code_dump_and_overflow_watch_on_a_keras_program(tmp_path):
    """opscope run with a dump section (the seeds' keys) and an overflow section on a script
    that never mentions opscope: the watch reports the first NaN op, its layer, step and inputs,
    as opscope.tensorflow.watch does, and the dump beside it is written whole (two sessions
    trace the same graphs)."""
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps({"overflow": {"action": "warn"},
                                  "dump": {"enable_dump": True, "dump_path": str(tmp_path / "d"),
                                           "dump_step": "1", "dump_mode": "all"}}))
    proc = subprocess.run([sys.executable, "-m", "opscope", "run", "-c", str(config), "--", sys.executable,
                           str(TRAIN), "-", "--nan"], capture_output=True, text=True, timeout=300, env=ENV,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "NaN in tf.SelectV2 (module ff0b, forward, step 1" in proc.stderr, proc.stderr[-3000:]
    assert "from tf.GreaterEqual in ff0b" in proc.stderr and "first NaN/Inf" in proc.stderr
    # the launcher's line names PyTorch's levels; the TensorFlow program then says its own
    assert "overflow watch (op, action warn, every step)" in proc.stderr, proc.stderr[-3000:]
    dump = opscope.load(tmp_path / "d")
    assert dump.status == "complete" and dump.steps() == [1] and dump.manifest["level"] == "tf-op"
    df = dump.records().to_pandas()
    assert {"forward", "backward", "optimizer"} == set(df.phase) and "ff0a/kernel" in set(df.param)
    assert df.nan.fillna(0).sum() > 0
    assert not df.op.str.contains("EagerPyFunc").any()  # neither session records the other's host callback


VALIDATE = textwrap.dedent("""
    import os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import numpy as np, tensorflow as tf, keras, opscope.tensorflow as otf
    keras.utils.set_random_seed(0)
    inp = keras.Input((32,))
    m = keras.Model(inp, keras.layers.Dense(10, name="head")(keras.layers.Dense(64, name="hid")(inp)))
    m.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 32)).astype("float32"), rng.integers(0, 10, 64).astype("int32")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    val = ds.take(2) if sys.argv[2] == "val" else None
    if sys.argv[3:] == ["block"]:  # a with-block around fit, no callback
        with otf.dump(sys.argv[1], steps="3|4", overwrite=True):
            m.fit(ds, epochs=2, verbose=0, validation_data=val)
        m.fit(ds, epochs=1, verbose=0, validation_data=val)  # after the dump: fit is fit again
        assert "fit" not in keras.Model.__dict__ or keras.Model.fit.__name__ != "joined_fit"
    else:
        m.fit(ds, epochs=2, verbose=0, validation_data=val,
              callbacks=[otf.DumpCallback(sys.argv[1], steps="3|4", overwrite=True)])
""")


@pytest.mark.parametrize("how", ["callback", "block"])
def test_fits_validation_joins_no_steps_records(tmp_path, how):
    """Validation runs between epoch 1's last batch (step 3) and epoch 2's first (step 4): a
    dump of both steps records the same ops with validation as without (its test function's
    forward ops used to join step 4's records: 159 forward records against 51), with the
    callback and with a with-block around fit (177 forward records against 58 before)."""
    (tmp_path / "v.py").write_text(VALIDATE)
    counts = {}
    for mode in ("val", "noval"):
        proc = subprocess.run([sys.executable, "v.py", str(tmp_path / mode), mode, how], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300, env=ENV)
        assert proc.returncode == 0, proc.stderr[-3000:]
        df = opscope.load(tmp_path / mode).records().to_pandas()
        counts[mode] = df.groupby(["step", "phase", "op"]).size().to_dict()
    assert counts["val"] == counts["noval"]
    assert {step for step, _, _ in counts["val"]} == {3, 4}
