"""The torch op vocabulary every op table maps onto.

A PyTorch dump names aten ops ``aten.addmm.default`` (or ``aten::addmm``), torch API calls
``torch.nn.functional.linear`` or ``Tensor.add``, and modules by class (``BatchNorm2d``).
:func:`torch_key` reduces every spelling to the overload packet (``aten.addmm``) or the API
name, and :func:`torch_keys` adds the aten name an API call stands for: tables list torch
ops under those keys.
"""

from __future__ import annotations

import re

_ATEN = re.compile(r"^(?:torch\.ops\.)?aten(?:\.|::)([A-Za-z0-9_]+)")
# torch API spellings: torch.add, torch.nn.functional.gelu, Tensor.add, torch.Tensor.__add__
_API = re.compile(r"^(?:torch\.(?:nn\.functional\.|special\.|linalg\.)?|(?:torch\.)?Tensor\.)([A-Za-z0-9_]+)$")
_DUNDER = {"matmul": "matmul", "rmatmul": "matmul", "add": "add", "radd": "add", "iadd": "add_",
           "sub": "sub", "rsub": "rsub", "isub": "sub_", "mul": "mul", "rmul": "mul", "imul": "mul_",
           "truediv": "div", "rtruediv": "div", "itruediv": "div_", "pow": "pow", "neg": "neg",
           "getitem": "index"}

# Torch ops (and module classes, at module level) that keep every element in place (a reshape,
# a copy, a cast): one that runs on one side only is judged as an identity between its input
# and its output. Transposes, slices and broadcasts are not (another arrangement of elements).
ORDER_PRESERVING: frozenset[str] = frozenset({
    "aten.view", "aten._unsafe_view", "aten.reshape", "aten.flatten", "aten.unflatten", "aten.squeeze",
    "aten.unsqueeze", "aten.clone", "aten.contiguous", "aten.alias", "aten.detach", "aten.dropout",
    "aten._to_copy", "aten.to", "aten.lift_fresh", "aten.expand",
    # module level: class names
    "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Cast", "CastLike", "Dropout", "Expand",
    "Unflatten",
})

# Module classes that compute a batch norm: at module level they fold like ``aten.batch_norm``.
BATCH_NORM_MODULES = ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm")


def torch_key(op: str) -> str:
    """One spelling per torch op: ``aten::addmm``, ``aten.addmm.default`` -> ``aten.addmm``."""
    m = _ATEN.match(op)
    return f"aten.{m.group(1)}" if m else op


def torch_keys(op: str) -> frozenset[str]:
    """Every table key a torch op name may be listed under: ``Tensor.matmul`` ->
    {``Tensor.matmul``, ``aten.matmul``}; ``torch.Tensor.__truediv__`` -> {..., ``aten.div``};
    a batch-norm module class -> {its name, ``aten.batch_norm``}."""
    key = torch_key(op)
    if key in BATCH_NORM_MODULES:
        return frozenset({key, "aten.batch_norm"})
    m = _API.match(key)
    if not m:
        return frozenset({key})
    base = m.group(1)
    if base.startswith("__") and base.endswith("__"):
        base = _DUNDER.get(base.strip("_"), base.strip("_"))
    return frozenset({key, f"aten.{base}"})


def preserves_order(op: str) -> bool:
    """True for torch ops whose output holds their input's elements in the same order
    (:data:`ORDER_PRESERVING`): ``aten.view``, ``Tensor.reshape``, a ``Flatten`` module..."""
    return not torch_keys(op).isdisjoint(ORDER_PRESERVING)
