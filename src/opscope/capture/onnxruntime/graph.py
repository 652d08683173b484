"""The ONNX side of capture: load a model, optimise it, expose values, build sessions.

onnx and onnxruntime are imported here, lazily, inside functions: ``import opscope``
and the CLI start without them, and a missing package is a one-line message.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opscope.errors import ConfigError, OpscopeError

OPT_LEVELS = ("disable", "basic", "extended", "all")
_ORT_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
               "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}
_PROVIDER_ALIASES = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider",
                     "tensorrt": "TensorrtExecutionProvider", "trt": "TensorrtExecutionProvider",
                     "rocm": "ROCMExecutionProvider", "openvino": "OpenVINOExecutionProvider",
                     "dml": "DmlExecutionProvider", "coreml": "CoreMLExecutionProvider"}
_PROTO_LIMIT = 1 << 30  # serialise bigger models to a file with external data, not to bytes


class OnnxCaptureError(OpscopeError):
    """The ONNX model cannot be loaded or run (missing, corrupt, rejected by ONNX Runtime)."""


def require_onnx() -> tuple[Any, Any]:
    """``(onnx, onnxruntime)``, or a clear error naming the extra to install."""
    try:
        import onnx
        import onnxruntime
    except ImportError as exc:
        raise OnnxCaptureError(f"ONNX capture needs onnx and onnxruntime ({exc.name} is missing); "
                               "install them with: pip install 'opscope[onnx]'") from None
    return onnx, onnxruntime


@dataclass
class GraphNode:
    """One node of the graph that runs, in topological order."""

    index: int
    name: str
    op_type: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    metadata: dict[str, str] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)


def load_model(model: Any) -> Any:
    """An ``onnx.ModelProto`` from a path, bytes or a ModelProto (copied, never modified)."""
    onnx, _ = require_onnx()
    if isinstance(model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        return copy
    if isinstance(model, (bytes, bytearray)):
        return _parse(onnx, bytes(model), "the given bytes")
    path = Path(os.fspath(model))
    if not path.is_file():
        raise OnnxCaptureError(f"ONNX model {str(path)!r} does not exist; check the path")
    try:
        loaded = onnx.load(str(path))
    except Exception as exc:  # protobuf DecodeError, missing external data, ...
        raise OnnxCaptureError(f"{str(path)!r} is not a readable ONNX model ({type(exc).__name__}: "
                               f"{exc}); it may be truncated or not an .onnx file") from None
    if not loaded.graph.node:
        raise OnnxCaptureError(f"{str(path)!r} holds no graph nodes: it is empty or not an ONNX model")
    return loaded


def _parse(onnx: Any, raw: bytes, where: str) -> Any:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(raw)
    except Exception as exc:
        raise OnnxCaptureError(f"{where} is not an ONNX model ({type(exc).__name__}: {exc})") from None
    if not model.graph.node:
        raise OnnxCaptureError(f"{where} holds no graph nodes: it is empty or not an ONNX model")
    return model


def resolve_provider(name: str | None) -> list[str]:
    """Providers for the session: the asked one, then CPU for the nodes it cannot run."""
    _, ort = require_onnx()
    available = ort.get_available_providers()
    if name is None:
        return ["CPUExecutionProvider"]
    full = _PROVIDER_ALIASES.get(name.lower(), name)
    match = [p for p in available if p.lower() in (full.lower(), f"{full.lower()}executionprovider")]
    if not match:
        raise ConfigError(f"provider: {name!r} is not available in this onnxruntime "
                          f"({ort.__version__}); available: {', '.join(available)}")
    return match + (["CPUExecutionProvider"] if match[0] != "CPUExecutionProvider" else [])


def check_opt_level(level: str | None) -> str:
    if level is None:
        return "disable"
    if not isinstance(level, str) or level.lower() not in OPT_LEVELS:
        raise ConfigError(f"opt_level: {level!r} is not allowed; allowed: {', '.join(OPT_LEVELS)}")
    return level.lower()


def session(model: Any, providers: list[str], level: str = "disable",
            optimized_path: str | None = None) -> Any:
    """An ``InferenceSession`` over ``model``; ONNX Runtime's errors become OnnxCaptureError."""
    onnx, ort = require_onnx()
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _ORT_LEVELS[level])
    options.log_severity_level = 3
    if optimized_path:
        options.optimized_model_filepath = optimized_path
    with tempfile.TemporaryDirectory(prefix="opscope-onnx-") as tmp:
        if model.ByteSize() < _PROTO_LIMIT:
            source: Any = model.SerializeToString()
        else:
            source = os.path.join(tmp, "model.onnx")
            onnx.save_model(model, source, save_as_external_data=True, location="model.data")
        try:
            return ort.InferenceSession(source, options, providers=providers)
        except Exception as exc:
            raise OnnxCaptureError(f"ONNX Runtime cannot load the model: {_short(exc)}") from None


def optimize(model: Any, providers: list[str], level: str) -> Any:
    """The graph ONNX Runtime runs at ``level``: its optimised model, saved and read back."""
    onnx, _ = require_onnx()
    if level == "disable":
        return model
    with tempfile.TemporaryDirectory(prefix="opscope-onnx-") as tmp:
        path = os.path.join(tmp, "optimized.onnx")
        session(model, providers, level, optimized_path=path)
        return onnx.load(path)


def nodes_of(model: Any) -> list[GraphNode]:
    """The top-level nodes in graph order (topological by the ONNX spec), with unique names."""
    out, seen = [], set()
    for i, node in enumerate(model.graph.node):
        name = node.name or f"{node.op_type}#{i}"
        if name in seen:
            name = f"{name}#{i}"
        seen.add(name)
        out.append(GraphNode(i, name, node.op_type, node.domain, list(node.input), list(node.output),
                             {p.key: p.value for p in node.metadata_props}, _attrs(node)))
    return out


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    attrs: dict[str, Any] = {}
    for attr in node.attribute:
        try:
            value = helper.get_attribute_value(attr)
        except Exception:
            continue
        attrs[attr.name] = _jsonable(value)
    return attrs


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (int, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "dims") and hasattr(value, "data_type"):  # TensorProto
        from onnx import numpy_helper

        arr = numpy_helper.to_array(value)
        if arr.size <= 16:
            return {"tensor": arr.dtype.name, "shape": list(arr.shape), "value": _jsonable(arr.tolist())}
        return {"tensor": arr.dtype.name, "shape": list(arr.shape)}
    if hasattr(value, "node"):  # GraphProto of If/Loop/Scan
        return {"graph": value.name, "nodes": len(value.node)}
    return str(value)


def attrs_json(node: GraphNode, torch_op: str | None) -> str:
    data: dict[str, Any] = {"attrs": node.attrs}
    if node.domain not in ("", "ai.onnx"):
        data["domain"] = node.domain
    if torch_op:
        data["torch_op"] = torch_op
    return json.dumps(data, separators=(",", ":"), sort_keys=True)


def graph_inputs(model: Any) -> list[str]:
    """Graph inputs that are fed (initializers listed as inputs are not)."""
    inits = {i.name for i in model.graph.initializer}
    return [v.name for v in model.graph.input if v.name not in inits]


def estimate_bytes(model: Any, sample: dict[str, Any], names: list[str]) -> dict[str, int | None]:
    """Bytes of each named value for this sample's shapes, by shape inference; None if unknown."""
    onnx, _ = require_onnx()
    from onnx import helper

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.initializer[:]  # shapes only; keeps inference cheap on big models
    inits = {i.name: i for i in model.graph.initializer}
    for value in probe.graph.input:
        if value.name in sample:
            dims = value.type.tensor_type.shape.dim
            for dim, size in zip(dims, sample[value.name].shape):
                dim.Clear()
                dim.dim_value = int(size)
    for name, init in inits.items():
        if name not in {v.name for v in probe.graph.input}:
            probe.graph.input.append(helper.make_tensor_value_info(name, init.data_type, list(init.dims)))
    try:
        inferred = onnx.shape_inference.infer_shapes(probe, strict_mode=False, data_prop=True)
    except Exception:
        return {name: None for name in names}
    found = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    return {name: _value_bytes(found.get(name)) for name in names}


def _value_bytes(value: Any) -> int | None:
    if value is None or not value.type.HasField("tensor_type"):
        return None
    from onnx import helper

    tensor = value.type.tensor_type
    if not tensor.HasField("shape") or not tensor.elem_type:
        return None
    dims = [d.dim_value for d in tensor.shape.dim if d.HasField("dim_value")]
    if len(dims) < len(tensor.shape.dim):  # a symbolic or unknown dimension
        return None
    try:
        itemsize = helper.tensor_dtype_to_np_dtype(tensor.elem_type).itemsize
    except Exception:
        itemsize = 8
    return math.prod(dims) * itemsize


def batches(names: list[str], sizes: dict[str, int | None], limit: int) -> list[list[str]]:
    """Split the values to fetch into runs whose outputs fit in ``limit`` bytes together.

    A value of unknown size counts as the largest known one. One value bigger than the
    limit gets a run of its own.
    """
    known = [s for s in sizes.values() if s is not None]
    default = max(known) if known else 0
    out: list[list[str]] = [[]]
    total = 0
    for name in names:
        size = sizes.get(name)
        size = default if size is None else size
        if out[-1] and total + size > limit:
            out.append([])
            total = 0
        out[-1].append(name)
        total += size
    return [b for b in out if b]


def exposed(model: Any, names: list[str]) -> Any:
    """A copy of ``model`` whose graph outputs are exactly ``names`` (types left to ONNX Runtime)."""
    onnx, _ = require_onnx()
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    keep = {v.name: v for v in copy.graph.output}
    outputs = [keep[n] if n in keep else onnx.ValueInfoProto(name=n) for n in names]
    del copy.graph.output[:]
    copy.graph.output.extend(outputs)
    return copy


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:600]


def run_error(exc: BaseException) -> OnnxCaptureError:
    return OnnxCaptureError(f"ONNX Runtime failed while running the model: {_short(exc)}")
