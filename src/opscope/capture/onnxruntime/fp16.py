"""Convert an fp32 ONNX model to float16, for "fp16 model vs its fp32 original" comparisons.

A small converter built on onnx's own helpers (no onnxconverter-common needed):

- float32 initializers, ``Constant`` tensors and value types become float16; ``Cast(to=FLOAT)``
  becomes ``Cast(to=FLOAT16)``. Values beyond float16's range become ``inf``, as they
  would in a real conversion: that is the fault this helper exists to reproduce.
- ``keep_io_types=True`` (default) keeps float32 graph inputs and outputs, with a ``Cast``
  after each input and before each output, so the same ``inputs.npz`` feeds both models.
  The cast nodes are named ``<value>/CastToFloat16`` and ``<value>/CastToFloat32``; every
  other node keeps its name (and its output names, except that a graph output ``y`` is now
  produced as ``y/fp16`` and cast), so the two dumps line up node by node.
- ``keep_fp32`` names ops (``{"Resize"}``) or node names left in float32, with casts around.

ONNX Runtime's CPU provider lacks float16 kernels for some ops; it then runs them in
float32 between casts it inserts itself, and the rounding to float16 (and any overflow)
still happens at the node's output. Subgraphs (``If``/``Loop`` bodies) are not converted.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# Inputs that must stay float32 whatever the model's float type: (op type, input index).
_FLOAT32_ONLY_INPUTS = {("Resize", 2), ("Upsample", 1)}


def convert_to_float16(model: Any, *, keep_io_types: bool = True,
                       keep_fp32: Iterable[str] = ()) -> Any:
    """A float16 copy of ``model`` (an ``onnx.ModelProto``); the original is not changed.

    Args:
        model: the float32 model.
        keep_io_types: keep float32 graph inputs and outputs (casts inserted inside).
        keep_fp32: op types or node names to leave in float32.

    Returns:
        The converted ``onnx.ModelProto``, checked with ``onnx.checker``.
    """
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    keep = set(keep_fp32)
    float32_only = _float32_only_values(graph, keep)
    _convert_initializers(graph, float32_only)
    for node in graph.node:
        if node.op_type in keep or node.name in keep:
            continue
        _convert_node(node)
    io_values = {v.name for v in graph.input} | {v.name for v in graph.output}
    for value in graph.value_info:
        if value.name not in float32_only:
            _retype(value)
    _wrap_kept_nodes(graph, keep)
    if keep_io_types:
        _cast_io(graph)
    else:
        for value in list(graph.input) + list(graph.output):
            if value.name in io_values:
                _retype(value)
    onnx.checker.check_model(out)
    return out


def _float32_only_values(graph: Any, keep: set[str]) -> set[str]:
    names = set()
    for node in graph.node:
        for i, name in enumerate(node.input):
            if (node.op_type, i) in _FLOAT32_ONLY_INPUTS or node.op_type in keep or node.name in keep:
                names.add(name)
    return names


def _convert_initializers(graph: Any, float32_only: set[str]) -> None:
    import numpy as np
    from onnx import TensorProto, numpy_helper

    for i, init in enumerate(graph.initializer):
        if init.data_type == TensorProto.FLOAT and init.name not in float32_only:
            with np.errstate(over="ignore"):
                half = numpy_helper.to_array(init).astype(np.float16)
            graph.initializer[i].CopyFrom(numpy_helper.from_array(half, init.name))


def _convert_node(node: Any) -> None:
    import numpy as np
    from onnx import TensorProto, numpy_helper

    for attr in node.attribute:
        if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT:
            attr.i = TensorProto.FLOAT16
        elif attr.type == attr.TENSOR and attr.t.data_type == TensorProto.FLOAT:
            with np.errstate(over="ignore"):
                half = numpy_helper.to_array(attr.t).astype(np.float16)
            attr.t.CopyFrom(numpy_helper.from_array(half, attr.t.name))
        elif node.op_type == "ConstantOfShape" and attr.name == "value" and attr.t.data_type == TensorProto.FLOAT:
            attr.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(attr.t).astype(np.float16)))


def _retype(value: Any) -> None:
    from onnx import TensorProto

    tensor = value.type.tensor_type
    if value.type.HasField("tensor_type") and tensor.elem_type == TensorProto.FLOAT:
        tensor.elem_type = TensorProto.FLOAT16


def _wrap_kept_nodes(graph: Any, keep: set[str]) -> None:
    """Float32 nodes in a float16 graph: cast their float inputs up and outputs down."""
    from onnx import TensorProto, helper

    if not keep:
        return
    nodes = list(graph.node)
    del graph.node[:]
    for node in nodes:
        if node.op_type not in keep and node.name not in keep:
            graph.node.append(node)
            continue
        for i, name in enumerate(node.input):
            if name and (node.op_type, i) not in _FLOAT32_ONLY_INPUTS and not _is_initializer(graph, name):
                cast = f"{name}/{node.name}/CastToFloat32"
                graph.node.append(helper.make_node("Cast", [name], [cast], name=cast, to=TensorProto.FLOAT))
                node.input[i] = cast
        renamed = []
        for i, name in enumerate(node.output):
            if name:
                node.output[i] = f"{name}/fp32"
                renamed.append((node.output[i], name))
        graph.node.append(node)
        for src, dst in renamed:
            graph.node.append(helper.make_node("Cast", [src], [dst], name=f"{dst}/CastToFloat16",
                                               to=TensorProto.FLOAT16))


def _is_initializer(graph: Any, name: str) -> bool:
    return any(init.name == name for init in graph.initializer)


def _cast_io(graph: Any) -> None:
    """Keep float32 graph inputs/outputs: insert a Cast after each input and before each output."""
    from onnx import TensorProto, helper

    inits = {init.name for init in graph.initializer}
    head, tail = [], []
    for value in graph.input:
        if value.name in inits or value.type.tensor_type.elem_type != TensorProto.FLOAT:
            continue
        half = f"{value.name}/fp16"
        for node in graph.node:
            for i, name in enumerate(node.input):
                if name == value.name:
                    node.input[i] = half
        head.append(helper.make_node("Cast", [value.name], [half], name=f"{value.name}/CastToFloat16",
                                     to=TensorProto.FLOAT16))
    for value in graph.output:
        if value.type.tensor_type.elem_type != TensorProto.FLOAT:
            continue
        half = f"{value.name}/fp16"
        for node in graph.node:
            for i, name in enumerate(node.output):
                if name == value.name:
                    node.output[i] = half
            for i, name in enumerate(node.input):
                if name == value.name:
                    node.input[i] = half
        tail.append(helper.make_node("Cast", [half], [value.name], name=f"{value.name}/CastToFloat32",
                                     to=TensorProto.FLOAT))
    nodes = head + list(graph.node) + tail
    del graph.node[:]
    graph.node.extend(nodes)
