"""ONNX Runtime capture: every intermediate tensor of an ONNX graph, as opscope records.

``dump_onnx(model, inputs, path)`` (CLI: ``opscope dump-onnx``) writes the same dump format
as the PyTorch capture, with module paths taken from the torch.onnx exporter's scopes so
the two line up. :mod:`.ops` maps ONNX op types to the torch ops they stand for (for
compare); :mod:`.fp16` converts a model to float16 for "fp16 vs fp32" checks.

onnx and onnxruntime are optional (``pip install 'opscope[onnx]'``) and imported lazily.
"""

from __future__ import annotations

from typing import Any

__all__ = ["OnnxCaptureError", "convert_to_float16", "dump_onnx"]


def __getattr__(name: str) -> Any:
    if name == "dump_onnx":
        from opscope.capture.onnxruntime.capture import dump_onnx

        return dump_onnx
    if name == "convert_to_float16":
        from opscope.capture.onnxruntime.fp16 import convert_to_float16

        return convert_to_float16
    if name == "OnnxCaptureError":
        from opscope.capture.onnxruntime.graph import OnnxCaptureError

        return OnnxCaptureError
    raise AttributeError(f"module 'opscope.capture.onnxruntime' has no attribute {name!r}")
