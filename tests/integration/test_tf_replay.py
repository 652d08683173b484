"""Replay on TensorFlow dumps: a recorded tf op re-run by TensorFlow in float64 from its own
recorded inputs, attributes and trace-time constants (capture/tensorflow/opattrs.py,
replay/tf_ops.py), on tensor dumps of the Keras transformer of tf_train.py, float32 and
mixed_bfloat16, through the real CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from opscope.compare.tolerance import NoiseModel  # noqa: E402
from opscope.errors import ReplayError  # noqa: E402
from opscope.replay.engine import RowCache, replay_side  # noqa: E402
from opscope.storage.reader import load  # noqa: E402

TRAIN = Path(__file__).with_name("tf_train.py")
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
RUNS = {"f32": [], "bf16": ["--policy", "mixed_bfloat16"]}


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """Both runs in one process, one after another (tf_train.py --runs)."""
    root = tmp_path_factory.mktemp("tfreplay")
    spec = root / "runs.json"
    spec.write_text(json.dumps([[str(root / name), "--data", "tensor", "--steps", "0", *RUNS[name]] for name in RUNS]))
    proc = subprocess.run([sys.executable, str(TRAIN), "--runs", str(spec)], capture_output=True, text=True,
                          timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {name: root / name for name in RUNS}


def replay_cli(target: Path, reference: Path, op: str) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "opscope", "replay", str(target), str(reference), "--op", op,
                           "--json"], capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout)


def seq_of(dump: Path, node: str, op: str) -> int:
    rows = load(dump).records(step=0).to_pandas()
    hit = rows[(rows.node == node) & (rows.op == op) & (rows.io == "output")]
    assert len(hit) == 1, rows[rows.op == op].node.tolist()
    return int(hit.seq.iloc[0])


def test_a_bf16_matmul_is_right_for_its_inputs_on_both_sides(dumps):
    """ff0a's forward MatMul in bfloat16 against float32: each side is re-run by TensorFlow
    with its own transpose flags and dtypes; both are within their precision."""
    seq = seq_of(dumps["bf16"], "tiny_1/ff0a_1/Tensordot/MatMul", "tf.MatMul")
    code, out = replay_cli(dumps["bf16"], dumps["f32"], f"0:0:{seq}")
    assert code == 0 and out["verdict"] == "both_within", out
    target, reference = out["target"], out["reference"]
    assert target["dtype"] == "bfloat16" and reference["dtype"] == "float32"
    assert target["status"] == reference["status"] == "ok" and reference["reproduced"] is True, out
    assert "TensorFlow's CPU kernel" in out["reason"] and "transpose_b" in target["args"]
    # tf_train runs with oneDNN off; the replay starts TensorFlow so too (the manifest says
    # it), and the bf16 kernel then gives the recorded bits (with oneDNN on it did not)
    assert target["reproduced"] is True and not target["note"], target


def test_a_replay_that_cannot_match_the_runs_kernels_says_so(dumps):
    seq = seq_of(dumps["bf16"], "tiny_1/ff0a_1/Tensordot/MatMul", "tf.MatMul")
    proc = subprocess.run([sys.executable, "-m", "opscope", "replay", str(dumps["bf16"]), str(dumps["f32"]),
                           "--op", f"0:0:{seq}"], capture_output=True, text=True, timeout=300,
                          env={**ENV, "TF_ENABLE_ONEDNN_OPTS": "1"})  # the user chose otherwise
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "note (target): the dump ran TensorFlow with oneDNN off, this replay with it on" in proc.stdout, proc.stdout
    assert "TF_ENABLE_ONEDNN_OPTS=0" in proc.stdout


def test_an_output_off_by_a_little_is_the_target_wrong(dumps, tmp_path):
    """A kernel that got ff0a's MatMul wrong, injected into a copy of the float32 dump: its
    recorded output is off by 1e-3 in a few elements; replay blames the target alone."""
    bad = tmp_path / "bad"
    shutil.copytree(dumps["f32"], bad)
    rows = load(bad).records(step=0).to_pandas()
    out = rows[(rows.node == "tiny_1/ff0a_1/Tensordot/MatMul") & (rows.io == "output")].iloc[0]
    shard = bad / "rank0" / "step0" / out.data if (bad / "rank0" / "step0" / out.data).exists() else \
        next(bad.rglob(out.data))
    tensors = safetensors_numpy.load_file(str(shard))
    value = tensors[out.key].copy()
    value.reshape(-1)[:5] *= 1.001
    tensors[out.key] = value
    safetensors_numpy.save_file(tensors, str(shard))
    code, result = replay_cli(bad, dumps["f32"], f"0:0:{int(out.seq)}")
    assert code == 1 and result["verdict"] == "target_wrong", result
    assert result["target"]["status"] == "wrong" and result["reference"]["status"] == "ok"


def test_ops_that_cannot_be_rebuilt_say_why(dumps):
    cache, dump = RowCache(), load(dumps["f32"])
    rows = dump.records(step=0).to_pandas()
    write = int(rows[rows.op == "tf.AssignAddVariableOp"].seq.iloc[0])
    with pytest.raises(ReplayError, match="makes no tensor"):
        replay_side(dump, cache.call_rows(dump, 0, 0, write), "target", NoiseModel())
    absent = rows[(rows.note.fillna("").str.startswith("absent")) & (rows.io == "input")
                  & ~rows.op.str.startswith("tf.Assign")]
    with pytest.raises(ReplayError, match="absent"):
        replay_side(dump, cache.call_rows(dump, 0, 0, int(absent.seq.iloc[0])), "target", NoiseModel())


@pytest.mark.parametrize("name", list(RUNS))
def test_no_op_of_a_correct_run_is_judged_wrong(dumps, name):
    """Every op of a step that can be rebuilt is re-run; none of a correct run may come out
    wrong (a false alarm), and most ops that make a tensor can be rebuilt."""
    dump, cache = load(dumps[name]), RowCache()
    rows = dump.records(step=0).to_pandas()
    makers = sorted(set(rows[(rows.io == "output") & rows.data.notna()].seq))
    statuses = []
    for seq in makers:
        try:
            statuses.append(replay_side(dump, cache.call_rows(dump, 0, 0, int(seq)), "target", NoiseModel()).status)
        except ReplayError:
            continue
    assert "wrong" not in statuses
    assert len(statuses) > 0.8 * len(makers) and statuses.count("ok") > 0.95 * len(statuses), len(makers)


def test_a_bf16_op_and_its_float32_twin_record_the_same_args(dumps):
    """The types an op's inputs set (T) are left out of args: compare reads a layout op's
    args, and a bfloat16 run's transpose must not look like another transpose."""
    ours, theirs = (load(dumps[n]).records(step=0).to_pandas() for n in ("bf16", "f32"))
    both = ours.merge(theirs, on=["node", "io", "slot"], suffixes=("_t", "_r"))
    both = both[(both.op_t == both.op_r) & (both.op_t != "tf.Cast")]
    assert len(both) > 500 and both.args_t.notna().sum() > 300
    assert both.args_t.fillna("").equals(both.args_r.fillna("")), both[both.args_t != both.args_r][["node", "args_t"]]
