"""Statistics of numpy arrays for the ONNX Runtime capture: :mod:`opscope.model.tensor_stats`
(the definitions live in the model layer, where peer-dump readers use them too)."""

from __future__ import annotations

from opscope.model.tensor_stats import CHUNK, content_hash, dtype_name, tensor_stats

__all__ = ["CHUNK", "content_hash", "dtype_name", "tensor_stats"]
