"""msprobe's API names in opscope's ``level="api"`` vocabulary.

msprobe names a call ``<Prefix>.<api>.<counter>.<direction>`` (``Functional.linear.0.forward``,
``Tensor.__add__.3.backward``, ``Module.layers.0.fc.Linear.forward.0``); opscope's api level
names the function torch hands its ``__torch_function__`` (``torch.nn.functional.linear``,
``Tensor.add``). The prefixes map one to one; Python operators differ, because torch turns
most of them into the method they call (``x + y`` reaches ``__torch_function__`` as
``Tensor.add``). The operator table below was measured with torch 2.13's
``torch.overrides.TorchFunctionMode`` against msprobe 26.2.0's names.

msprobe's MindSpore side (framework ``"mindspore"``) names calls the same way with its own
prefixes (``Primitive.matmul.MatMul.0.forward``, ``Functional.gelu.0.forward``,
``Mint.add.0.forward``) and cells ``Cell.<path>.<Class>.<direction>.<counter>``; they are
kept in MindSpore's namespace (:func:`mindspore_name`).
"""

from __future__ import annotations

import re

# msprobe prefix -> opscope prefix
PREFIXES: dict[str, str] = {
    "Functional": "torch.nn.functional.",
    "Torch": "torch.",
    "Tensor": "Tensor.",
    "VF": "torch._VF.",
    "Distributed": "torch.distributed.",
    "Aten": "aten.",
}

# Tensor operators msprobe records by their dunder name, as opscope's api level names them.
OPERATORS: dict[str, str] = {
    "__add__": "add", "__radd__": "add", "__iadd__": "add_",
    "__sub__": "sub", "__isub__": "sub_",
    "__mul__": "mul", "__rmul__": "mul", "__imul__": "mul_",
    "__truediv__": "div", "__div__": "div", "__itruediv__": "div_", "__idiv__": "div_",
    "__rdiv__": "__rtruediv__",
    "__matmul__": "matmul",
    "__mod__": "remainder", "__imod__": "remainder_", "__ifloordiv__": "floor_divide_",
    "__neg__": "neg", "__abs__": "abs", "__pos__": "positive",
    "__gt__": "gt", "__ge__": "ge", "__lt__": "lt", "__le__": "le", "__ne__": "ne",
    "__rand__": "bitwise_and", "__ror__": "bitwise_or", "__rxor__": "bitwise_xor",
}

# <Prefix>.<api>.<counter>.<direction>; the api may itself hold dots (a module path)
_ENTRY = re.compile(r"^(?P<prefix>[A-Za-z]+)\.(?P<api>.+)\.(?P<counter>\d+)\.(?P<direction>forward|backward)$")
# Module.<path>.<Class>.<direction>.<counter> (and parameters_grad, recorded per module);
# msprobe's MindSpore side writes Cell. for Module.
_MODULE = re.compile(r"^(?:Module|Cell)\.(?:(?P<path>.+)\.)?(?P<cls>[^.]+)"
                     r"\.(?P<direction>forward|backward|parameters_grad)\.(?P<counter>\d+)$")


def parse_entry(name: str) -> tuple[str, str, int, str] | None:
    """``(prefix, api, counter, direction)`` of an API entry name, or None for another kind."""
    m = _ENTRY.match(name)
    if m is None or m.group("prefix") in ("Module", "Cell"):
        return None
    return m.group("prefix"), m.group("api"), int(m.group("counter")), m.group("direction")


def parse_module(name: str) -> tuple[str, str, str, int] | None:
    """``(module path, class, direction, counter)`` of a ``Module.`` entry, or None."""
    m = _MODULE.match(name)
    if m is None:
        return None
    return m.group("path") or "", m.group("cls"), m.group("direction"), int(m.group("counter"))


def api_name(prefix: str, api: str) -> str:
    """opscope's api-level name of msprobe's ``prefix.api`` (``Functional``, ``linear`` ->
    ``torch.nn.functional.linear``); an unknown prefix is kept (``NPU.npu_fusion_attention``)."""
    if prefix == "Tensor":
        return "Tensor." + OPERATORS.get(api, api)
    head = PREFIXES.get(prefix)
    return head + api if head is not None else f"{prefix}.{api}"


# msprobe's MindSpore prefixes -> the MindSpore API they wrap
MINDSPORE_PREFIXES: dict[str, str] = {
    "Functional": "mindspore.ops.",
    "Mint": "mindspore.mint.",
    "MintFunctional": "mindspore.mint.nn.functional.",
    "Tensor": "mindspore.Tensor.",
    "Distributed": "mindspore.communication.",
}


def mindspore_name(prefix: str, api: str) -> str:
    """An msprobe MindSpore API name in MindSpore's namespace. A primitive
    (``Primitive``, ``matmul.MatMul``) becomes ``mindspore.MatMul``: its op type, the name
    MindSpore's Data Dump gives the kernel, so compare's MindSpore vocabulary
    (:mod:`opscope.compare.opnames.mindspore`) says which torch op it behaves as. Others keep
    their API (``mindspore.ops.gelu``, ``mindspore.Tensor.mul`` for ``Tensor.__mul__``), whose
    last name is the torch one where compare has a rule for it."""
    if prefix == "Primitive":
        return "mindspore." + api.rsplit(".", 1)[-1]
    if prefix == "Tensor":
        return "mindspore.Tensor." + OPERATORS.get(api, api)
    head = MINDSPORE_PREFIXES.get(prefix)
    return head + api if head is not None else f"mindspore.{prefix}.{api}"


# MindSpore's dtype spellings (``Float32``, ``BFloat16``, ``Bool``) -> opscope's (torch's) names
_MINDSPORE_DTYPES: dict[str, str] = {"Bool": "bool", "BFloat16": "bfloat16", "Float64": "float64",
                                     "Float32": "float32", "Float16": "float16", "Complex64": "complex64",
                                     "Complex128": "complex128"}


def dtype_name(dtype: str) -> str:
    """A dtype as msprobe writes it (``torch.float32``; MindSpore's ``Float32``, ``Int64``,
    ``UInt8``, ``Bool``) in opscope's spelling (``float32``, ``int64``, ``uint8``, ``bool``)."""
    dtype = dtype.removeprefix("torch.").removeprefix("mindspore.")
    if dtype in _MINDSPORE_DTYPES:
        return _MINDSPORE_DTYPES[dtype]
    m = re.fullmatch(r"(U?)Int(\d+)", dtype)
    return f"{m.group(1).lower()}int{m.group(2)}" if m else dtype
