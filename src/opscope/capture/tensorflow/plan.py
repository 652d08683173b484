"""What a traced graph will hand to the host when it runs: the plan of its ops and values.

A *value* is one tensor whose statistics (and data) are taken once per run of the graph;
an op's inputs and outputs refer to values. Ops that only rename or reshape a tensor
(``Identity``, ``Reshape``...) with a fully known shape share their input's value, as the
PyTorch dump does with views: the same elements, so the same statistics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Ops whose output holds its input's elements unchanged (same order): measured once.
ALIASES = frozenset({"Identity", "Reshape", "ExpandDims", "Squeeze", "StopGradient", "Snapshot",
                     "EnsureShape", "PreventGradient"})
# Ops that are plumbing: no rows of their own (their outputs still feed others' rows).
SILENT = frozenset({"Const", "Placeholder", "NoOp", "Shape", "ShapeN", "Size", "Rank",
                    "VarIsInitializedOp", "VarHandleOp", "ReadVariableOp", "_Arg", "_Retval",
                    "BroadcastGradientArgs"})


ASSIGNS = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"})


@dataclass
class Ref:
    """One input or output of an op: which value, which op made it, which variable it is."""

    value: int                      # index into the graph's values (-1: not measured)
    producer: tuple[int, int] | None  # (op index, output slot) in the same graph run
    param: str | None = None        # the variable a ReadVariableOp read
    arg: str | None = None
    io: str | None = None           # "grad" for a gradient handed to the optimizer
    shape: list[int] | None = None  # a view's own shape (its value is its input's)


@dataclass
class OpPlan:
    op: str          # op type: MatMul, or a layer's class name at layer level
    node: str        # the TF op name (name scopes included), or the layer path
    module: str
    phase: str
    fwd_op: str | None
    inputs: list[Ref]
    outputs: list[Ref]
    note: str | None = None
    args: str | None = None  # JSON: a layer's settings compare needs (activation, data_format)


@dataclass
class GraphPlan:
    """Everything planned for one traced graph."""

    name: str
    xla: bool = False
    values: list[Any] = field(default_factory=list)        # graph tensors handed to the host
    value_of: dict[str, int] = field(default_factory=dict)  # tensor name -> value index
    made_by: dict[str, tuple[int, int]] = field(default_factory=dict)  # tensor name -> (op, slot)
    param_of: dict[str, str] = field(default_factory=dict)  # ReadVariableOp output name -> variable
    scopes: dict[str, tuple[str, str]] = field(default_factory=dict)  # name scope -> (module, op type)
    ops: list[OpPlan] = field(default_factory=list)
    constants: list[Any] = field(default_factory=list)      # measured Const values (index -2 - i)
    written: dict[str, Any] = field(default_factory=dict)   # resource name -> last value assigned here
    steps: bool = False          # traced an optimizer apply / gradient: its run ends a step
    contains_step: bool = False  # calls a graph that ends steps: not a step itself
    outer: GraphPlan | None = field(default=None, repr=False, compare=False)  # the graph it was traced in
    predicates: bool = False     # every value is a bool of at most 8 elements (a loop's condition)

    def around_steps(self) -> bool:
        """Plumbing of a loop over steps, which no step records: a graph that calls the step
        function (Keras' loop over ``steps_per_execution`` steps), or the condition of such a
        loop (traced in it, and computing only predicates)."""
        outer = self.outer
        return self.contains_step or (self.predicates and not self.steps and outer is not None
                                      and outer.contains_step)

    def value(self, tensor: Any, numeric: bool) -> int:
        """The value index of a graph tensor (adding it), or -1 when it is not measured:
        not numeric, or shape arithmetic (an integer vector of at most 8 elements).
        A constant is measured here, once; the rest when the graph runs."""
        name = tensor.name
        index = self.value_of.get(name)
        if index is None and numeric and not plumbing(tensor):
            index = self.value_of[name] = -2 - len(self.constants) if tensor.op.type == "Const" else len(self.values)
            if index < -1:
                self.constants.append(_constant(tensor))
            else:
                self.values.append(tensor)
        return -1 if index is None else index

    def module_of_gradient(self, node: str) -> tuple[str, str | None]:
        """The forward layer (and op type) a ``gradient_tape/...`` op differentiates."""
        rest = node[len("gradient_tape/"):] if node.startswith("gradient_tape/") else node
        parts = rest.split("/")
        for end in range(len(parts), 0, -1):
            hit = self.scopes.get("/".join(parts[:end]))
            if hit is not None:
                return hit
        return "", None


INTEGERS = frozenset({"int32", "int64", "int16", "int8", "uint8", "uint16", "uint32", "uint64"})


def predicate(tensor: Any) -> bool:
    """A bool of at most 8 elements, fully known."""
    return _few(tensor, frozenset({"bool"}), max_rank=None)


def plumbing(tensor: Any) -> bool:
    """Shape arithmetic: an integer scalar or vector of at most 8 elements, fully known."""
    return _few(tensor, INTEGERS, max_rank=1)


def _few(tensor: Any, dtypes: frozenset[str], max_rank: int | None) -> bool:
    """A tensor of one of ``dtypes`` with a fully known shape of at most 8 elements (and at
    most ``max_rank`` dimensions)."""
    try:
        if tensor.dtype.name not in dtypes:
            return False
        shape = tensor.shape
        return bool(shape.is_fully_defined()) and (max_rank is None or shape.rank <= max_rank) \
            and shape.num_elements() <= 8
    except (AttributeError, ValueError, TypeError):
        return False


def _constant(tensor: Any) -> Any:
    """A Const's value (numpy), read from the graph when it is traced."""
    import numpy as np
    from tensorflow.python.framework import tensor_util

    return np.asarray(tensor_util.constant_value(tensor))
