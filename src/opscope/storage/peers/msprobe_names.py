"""msprobe's API names in opscope's ``level="api"`` vocabulary.

msprobe names a call ``<Prefix>.<api>.<counter>.<direction>`` (``Functional.linear.0.forward``,
``Tensor.__add__.3.backward``, ``Module.layers.0.fc.Linear.forward.0``); opscope's api level
names the function torch hands its ``__torch_function__`` (``torch.nn.functional.linear``,
``Tensor.add``). The prefixes map one to one; Python operators differ, because torch turns
most of them into the method they call (``x + y`` reaches ``__torch_function__`` as
``Tensor.add``). The operator table below was measured with torch 2.13's
``torch.overrides.TorchFunctionMode`` against msprobe 26.2.0's names.
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
# Module.<path>.<Class>.<direction>.<counter> (and parameters_grad, recorded per module)
_MODULE = re.compile(r"^Module\.(?:(?P<path>.+)\.)?(?P<cls>[^.]+)\.(?P<direction>forward|backward|parameters_grad)"
                     r"\.(?P<counter>\d+)$")


def parse_entry(name: str) -> tuple[str, str, int, str] | None:
    """``(prefix, api, counter, direction)`` of an API entry name, or None for another kind."""
    m = _ENTRY.match(name)
    if m is None or m.group("prefix") == "Module":
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
