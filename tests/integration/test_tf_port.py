"""A Keras convnet against its PyTorch port (tf_port.py): layer-level TensorFlow dump against a
module-level PyTorch dump, with full tensors, paired by order and kind or through a mapping
file. Skipped when TensorFlow is not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")

import opscope  # noqa: E402

PORT = Path(__file__).with_name("tf_port.py")
MAPPING = {"modules": {"conv2d": "conv", "flatten": "flat", "dense_1": "fc1", "dense_2": "fc2", "dense_3": "head"}}


@pytest.fixture(scope="module")
def ports(tmp_path_factory):
    root = tmp_path_factory.mktemp("port")
    proc = subprocess.run([sys.executable, str(PORT), str(root), "right", "activation", "transpose"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


def table(result) -> list[dict]:
    return result.pairs_table.to_pylist()


def test_a_right_port_is_within_tolerance_paired_by_order_and_kind(ports):
    result = opscope.compare(ports / "right", ports / "keras", workers=1)
    assert result.verdict == "within_tolerance" and not result.culprits, result.culprits
    rows = [r for r in table(result) if r["step"] == 0 and r["kind"] != "unpaired"]
    outputs = {(r["module"], r["module_reference"]) for r in rows if r["io"] == "output"}
    # Keras' Dense(relu) and Conv2D(relu) hold the activation: their outputs pair with the ReLU modules'
    assert {("act0", "conv2d"), ("flat", "flatten"), ("act1", "dense_1"), ("fc2", "dense_2"),
            ("head", "dense_3")} <= outputs, outputs
    assert all(r["mode"] == "tensor" for r in rows if r["status"] != "identical")
    conv_in = next(r for r in rows if r["module"] == "" and r["io"] == "input")
    assert "transposed [0, 3, 1, 2]" in conv_in["note"]  # NHWC read as NCHW
    grads = {r["param"]: r for r in rows if r["io"] == "grad"}
    assert set(grads) == {f"{m}.{p}" for m in ("conv", "fc1", "fc2", "head") for p in ("weight", "bias")}
    assert all(g["status"] == "passed" for g in grads.values())
    # the kernel after Flatten: Keras' rows are H, W, C, torch's columns C, H, W
    assert "[6, 6, 4, 16] transposed [3, 2, 0, 1]" in grads["fc1.weight"]["note"]
    weights = {r["param"]: r for r in rows if r["io"] == "param"}
    assert set(weights) == set(grads) and all(w["status"] == "identical" for w in weights.values())


def test_the_mapping_file_pairs_by_name_with_keras_as_target(ports, tmp_path):
    mapping = tmp_path / "map.json"
    mapping.write_text(json.dumps(MAPPING))
    out = tmp_path / "c"
    proc = subprocess.run([sys.executable, "-m", "opscope", "compare", str(ports / "keras"), str(ports / "right"),
                           "--mapping", str(mapping), "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verdict"] == "within_tolerance" and summary["counts"]["failed"] == 0, summary["counts"]
    assert summary["counts"]["pairs"] >= 36, summary["counts"]


def test_a_wrong_activation_in_the_port_is_named_at_its_layer(ports):
    result = opscope.compare(ports / "activation", ports / "keras", workers=1)
    first = result.first_divergence
    assert result.verdict == "diverged" and first is not None
    assert (first.module, first.op, first.phase, first.step) == ("act1", "Tanh", "forward", 0), first


def test_a_transposed_weight_in_the_port_is_named_at_its_layer(ports):
    """A square kernel copied without its transpose: same statistics, so full tensors show it,
    as the weight that differs at the start of step 0 (a root), then the layer's output."""
    result = opscope.compare(ports / "keras", ports / "transpose", mapping=MAPPING, workers=1)
    first = result.first_divergence
    assert result.verdict == "diverged" and first is not None
    assert (first.kind, first.module, first.io, first.phase, first.step) == ("root", "dense_2", "param", "forward", 0)
    assert first.param.endswith("dense_2/kernel"), first
    dense_2 = {r["io"]: r["status"] for r in table(result) if r["step"] == 0 and r["module"] == "dense_2"
               and r["phase"] == "forward" and r["io"] in ("input", "output")}
    assert dense_2 == {"input": "passed", "output": "failed"}, dense_2
