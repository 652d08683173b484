"""msprobe's entry names parsed, and its API names in opscope's api-level vocabulary."""

from __future__ import annotations

import pytest

from opscope.storage.peers.msprobe_names import api_name, parse_entry, parse_module
from opscope.storage.peers.msprobe_records import safe_name


@pytest.mark.parametrize(("entry", "parsed"), [
    ("Functional.linear.0.forward", ("Functional", "linear", 0, "forward")),
    ("Tensor.__add__.12.backward", ("Tensor", "__add__", 12, "backward")),
    ("Torch.matmul.3.forward", ("Torch", "matmul", 3, "forward")),
    ("NPU.npu_fusion_attention.0.forward", ("NPU", "npu_fusion_attention", 0, "forward")),
    ("Module.layers.0.fc.Linear.forward.0", None),
    ("Functional.linear.forward", None),
])
def test_parse_entry(entry: str, parsed: tuple | None) -> None:
    assert parse_entry(entry) == parsed


@pytest.mark.parametrize(("entry", "parsed"), [
    ("Module.layers.0.fc.Linear.forward.0", ("layers.0.fc", "Linear", "forward", 0)),
    ("Module.head.Linear.parameters_grad.0", ("head", "Linear", "parameters_grad", 0)),
    ("Module.Net.backward.2", ("", "Net", "backward", 2)),
    ("Functional.linear.0.forward", None),
])
def test_parse_module(entry: str, parsed: tuple | None) -> None:
    assert parse_module(entry) == parsed


@pytest.mark.parametrize(("prefix", "api", "name"), [
    ("Functional", "linear", "torch.nn.functional.linear"),
    ("Torch", "relu", "torch.relu"),
    ("Tensor", "__add__", "Tensor.add"), ("Tensor", "__radd__", "Tensor.add"), ("Tensor", "__iadd__", "Tensor.add_"),
    ("Tensor", "__mul__", "Tensor.mul"), ("Tensor", "__truediv__", "Tensor.div"),
    ("Tensor", "__matmul__", "Tensor.matmul"), ("Tensor", "__gt__", "Tensor.gt"),
    ("Tensor", "__rsub__", "Tensor.__rsub__"), ("Tensor", "__eq__", "Tensor.__eq__"),
    ("Tensor", "add_", "Tensor.add_"), ("NPU", "npu_rms_norm", "NPU.npu_rms_norm"),
])
def test_api_names_match_opscope_api_level(prefix: str, api: str, name: str) -> None:
    assert api_name(prefix, api) == name


def test_operator_table_matches_torch() -> None:
    """The table was measured once; torch must still hand __torch_function__ these names."""
    torch = pytest.importorskip("torch")
    from torch.overrides import TorchFunctionMode

    from opscope.capture.torch.levels import api_name as opscope_name

    seen: list[str | None] = []

    class Names(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            seen.append(opscope_name(func))
            return func(*args, **(kwargs or {}))

    x, y = torch.randn(3, 3), torch.randn(3, 3)
    for dunder, call in {"__add__": lambda: x + y, "__radd__": lambda: 1 + x, "__mul__": lambda: x * y,
                         "__rmul__": lambda: 2 * x, "__truediv__": lambda: x / y, "__matmul__": lambda: x @ y,
                         "__gt__": lambda: x > y, "__ne__": lambda: x != y, "__mod__": lambda: x % y,
                         "__rsub__": lambda: 1 - x}.items():
        seen.clear()
        with Names():
            call()
        assert seen == [api_name("Tensor", dunder)], dunder


@pytest.mark.parametrize(("name", "ok"), [
    ("Functional.linear.0.forward.input.0.pt", True), ("../secret.pt", False), ("a/b.pt", False),
    ("..pt", False), (".hidden.pt", False), ("C:\\x.pt", False), ("x\x00.pt", False),
])
def test_safe_name(name: str, ok: bool) -> None:
    assert safe_name(name) is ok


@pytest.mark.parametrize(("op", "writes"), [
    ("Tensor.add_", True), ("Tensor.__setitem__", True), ("Tensor.__ipow__", True), ("Tensor.__iand__", True),
    ("Tensor.add", False), ("Tensor.__invert__", False), ("Tensor.__rsub__", False), ("torch.relu", False),
    ("torch.nn.functional.relu_", True),
])
def test_in_place_calls(op: str, writes: bool) -> None:
    from opscope.storage.peers.msprobe_records import _writes_input

    assert _writes_input(op) is writes
