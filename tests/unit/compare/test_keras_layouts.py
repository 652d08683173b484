"""Layouts of a Keras dump against a PyTorch port: which Keras tensors are read permuted, and
that the view the reader applies is the torch layout (numpy stands in for both frameworks)."""

from __future__ import annotations

import json

import numpy as np

from opscope.compare.align import Pair
from opscope.compare.crossframework.layers import torch_param
from opscope.compare.crossframework.layouts import apply_layouts, channels_last
from opscope.compare.crossframework.sides import Side
from opscope.compare.crossframework.tables.keras import KERAS
from opscope.storage.reader import place_view


def row(id_: int, seq: int, module: str, op: str, io: str, shape: list[int], producer: int | None = None,
        args: dict | None = None, param: str | None = None) -> dict:
    return {"id": id_, "seq": seq, "call": 0, "phase": "forward" if io != "grad" else "optimizer",
            "module": module, "op": op, "io": io, "slot": 0, "shape": shape, "numel": int(np.prod(shape)),
            "producer": producer, "param": param, "args": json.dumps(args) if args else None,
            "data": "t.safetensors", "key": str(id_), "hash": 7}


def keras_side() -> Side:
    """Conv2D(relu) [2, 3, 3, 4] -> Flatten [2, 36] -> Dense(5), and the Dense kernel's gradient."""
    rows = [row(0, 0, "conv2d", "Conv2D", "input", [2, 5, 5, 3], args={"data_format": "channels_last"}),
            row(1, 0, "conv2d", "Conv2D", "output", [2, 3, 3, 4], args={"activation": "relu"}),
            row(2, 1, "flatten", "Flatten", "input", [2, 3, 3, 4], producer=1),
            row(3, 1, "flatten", "Flatten", "output", [2, 36]),
            row(4, 2, "dense", "Dense", "input", [2, 36], producer=3),
            row(5, 2, "dense", "Dense", "output", [2, 5]),
            row(6, 3, "", "SGD.apply", "grad", [36, 5], param="net/dense/kernel")]
    rows[6]["layer_input"] = 4
    return Side.build("reference", "tf-layer", rows, KERAS)


def test_spatial_tensors_and_what_follows_them_are_channels_last():
    layout = channels_last(keras_side())
    assert layout[0] == [2, 5, 5, 3] and layout[1] == layout[2] == [2, 3, 3, 4]
    assert layout[3] == layout[4] == [2, 3, 3, 4]  # Flatten keeps H, W, C order
    assert 5 not in layout  # the Dense output is [N, units] in both frameworks


def test_views_read_keras_tensors_in_torch_layout():
    side = keras_side()
    rng = np.random.default_rng(0)
    nhwc, kernel = rng.standard_normal((2, 3, 3, 4)), rng.standard_normal((36, 5))
    torch = [{"shape": [2, 4, 3, 3], "data": "x"}, {"shape": [2, 36], "data": "x"}, {"shape": [5, 36], "data": "x"}]
    pairs = [Pair(dict(t), side.by_id[i], "aligned") for t, i in zip(torch, (1, 3, 6))]
    apply_layouts(pairs, side)
    conv, flat, grad = (p.r for p in pairs)
    assert conv["hash"] is None and "transposed [0, 3, 1, 2]" in pairs[0].note
    nchw = nhwc.transpose(0, 3, 1, 2)
    assert np.array_equal(place_view(nhwc, json.loads(conv["view"])), nchw)
    assert np.array_equal(place_view(nhwc.reshape(2, 36), json.loads(flat["view"])).reshape(2, 36),
                          nchw.reshape(2, 36))  # torch's Flatten of NCHW
    # the Dense kernel over H, W, C rows against a Linear weight over C, H, W columns
    weight = kernel.reshape(3, 3, 4, 5).transpose(3, 2, 0, 1).reshape(5, 36)
    assert np.array_equal(place_view(kernel, json.loads(grad["view"])).reshape(5, 36), weight)


def test_equal_shapes_outside_a_spatial_layer_are_read_as_they_are():
    side = Side.build("reference", "tf-layer", [row(0, 0, "d", "Dense", "input", [2, 4, 4, 4]),
                                                row(1, 0, "d", "Dense", "output", [2, 4, 4, 4])], KERAS)
    pair = Pair({"shape": [2, 4, 4, 4], "data": "x"}, side.by_id[1], "aligned")
    apply_layouts([pair], side)
    assert pair.r.get("view") is None and pair.r["hash"] == 7


def test_keras_variables_get_their_torch_names_through_the_matched_layer():
    owners = {"dense_1": "fc1", "attn0.query": "q_proj", "": ""}
    assert torch_param("net/dense_1/kernel", owners) == "fc1.weight"
    assert torch_param("dense_1/bias", owners) == "fc1.bias"
    assert torch_param("tfm/attn0/query/kernel", owners) == "q_proj.weight"
    assert torch_param("net/dense_9/kernel", owners) is None
    assert torch_param("net/dense_1/counter", owners) is None


def test_an_einsum_kernel_moves_its_output_axes_first():
    rng = np.random.default_rng(1)
    query, out = rng.standard_normal((8, 2, 4)), rng.standard_normal((2, 4, 8))  # (d, heads, head_dim), back
    grads = [row(0, 0, "", "Adam.apply", "grad", [8, 2, 4], param="attn/query/kernel"),
             row(1, 0, "", "Adam.apply", "grad", [2, 4, 8], param="attn/out/kernel")]
    side = Side.build("reference", "tf-layer", grads, KERAS)
    pairs = [Pair({"shape": [8, 8], "data": "x"}, side.by_id[i], "aligned") for i in (0, 1)]
    apply_layouts(pairs, side)
    assert np.array_equal(place_view(query, json.loads(pairs[0].r["view"])).reshape(8, 8), query.reshape(8, 8).T)
    assert np.array_equal(place_view(out, json.loads(pairs[1].r["view"])).reshape(8, 8), out.reshape(8, 8).T)
