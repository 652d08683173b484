"""MindSpore op types as torch computations, for replaying MindSpore Data Dumps.

A MindSpore dump writes every input of a kernel, the constant attribute inputs included
(MatMul's ``transpose_a``/``transpose_b`` as Bool scalars, a LayerNorm's axes and epsilon,
Softmax's axis, a reduction's axes and ``keep_dims``): each entry below takes them in the
kernel's input order and returns the kernel's outputs. Checked against the kernels' own
outputs in tests/data/mindspore/ (``tests/unit/replay/test_replay_peers.py``).

Op types missing here are not replayable, and say so; add one with
``opscope.replay.register_replay("mindspore.<OpType>")`` (called with the inputs in order).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


@dataclass
class Outputs:
    """What the recorded outputs look like (dtype and shape each): Cast and Reshape take
    their target from there; ``golden``: the run in float64."""

    dtypes: list[torch.dtype]
    shapes: list[list[int]]
    golden: bool


Kernel = Callable[[Sequence[Tensor], Outputs], Tensor | Sequence[Tensor]]


def _flag(t: Tensor | None) -> bool:
    return bool(t.reshape(-1)[0]) if t is not None and t.numel() else False


def _ints(t: Tensor) -> list[int]:
    return [int(v) for v in t.reshape(-1).tolist()]


def _at(inputs: Sequence[Tensor], i: int) -> Tensor | None:
    return inputs[i] if len(inputs) > i else None


def _matmul(inputs: Sequence[Tensor], _: Outputs) -> Tensor:
    """MatMul / BatchMatMul (x, y, transpose_a, transpose_b): the last two axes."""
    x, y = inputs[0], inputs[1]
    if _flag(_at(inputs, 2)):
        x = x.transpose(-1, -2)
    if _flag(_at(inputs, 3)):
        y = y.transpose(-1, -2)
    return torch.matmul(x, y)


def _bias_add(inputs: Sequence[Tensor], _: Outputs) -> Tensor:
    """BiasAdd (x, bias, data_format): the bias on the channel axis (1, or the last for NHWC)."""
    x, b = inputs[0], inputs[1]
    fmt = _ints(inputs[2])[0] if len(inputs) > 2 and inputs[2].numel() else 0
    axis = x.dim() - 1 if fmt == 1 or x.dim() <= 2 else 1  # Format enum: NCHW 0, NHWC 1
    shape = [1] * x.dim()
    shape[axis] = b.numel()
    return x + b.reshape(shape)


def _layer_norm(inputs: Sequence[Tensor], out: Outputs) -> list[Tensor]:
    """LayerNorm (x, gamma, beta, begin_norm_axis, begin_params_axis, epsilon) -> (y, mean,
    variance), the mean and variance over the normalized axes, kept as size-1 axes."""
    x, gamma, beta = inputs[0], inputs[1], inputs[2]
    axis = _ints(inputs[3])[0] if len(inputs) > 3 else -1
    eps = float(inputs[5].reshape(-1)[0]) if len(inputs) > 5 else 1e-7
    axis = axis % x.dim()
    dims = tuple(range(axis, x.dim()))
    mean = x.mean(dim=dims, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=dims, keepdim=True)
    y = (x - mean) * torch.rsqrt(var + eps) * gamma + beta
    return [y, mean, var]


def _reduce(fn: Callable[..., Tensor]) -> Kernel:
    """ReduceSum/Mean/Max/Min/Prod (x, axis, keep_dims, skip_mode): no axis is every axis
    (with ``skip_mode`` true: nothing to reduce)."""
    def kernel(inputs: Sequence[Tensor], _: Outputs) -> Tensor:
        x = inputs[0]
        axes = _ints(inputs[1]) if len(inputs) > 1 else []
        keep = _flag(_at(inputs, 2))
        if not axes:
            if _flag(_at(inputs, 3)):
                return x
            axes = list(range(x.dim()))
        for axis in sorted((a % x.dim() for a in axes), reverse=True):
            x = fn(x, axis, keep)
        return x
    return kernel


def _softmax(fn: Callable[..., Tensor]) -> Kernel:
    def kernel(inputs: Sequence[Tensor], _: Outputs) -> Tensor:
        axes = _ints(inputs[1]) if len(inputs) > 1 else [-1]
        if len(axes) != 1:
            raise ValueError(f"softmax over {len(axes)} axes")
        return fn(inputs[0], dim=axes[0])
    return kernel


def _unary(fn: Callable[[Tensor], Tensor]) -> Kernel:
    return lambda inputs, _: fn(inputs[0])


def _binary(fn: Callable[[Tensor, Tensor], Tensor]) -> Kernel:
    return lambda inputs, _: fn(inputs[0], inputs[1])


def _cast(inputs: Sequence[Tensor], out: Outputs) -> Tensor:
    """Cast (x, dst_type): to the recorded output's dtype (float64 in the golden run)."""
    x, dtype = inputs[0], out.dtypes[0]
    if out.golden and dtype.is_floating_point:
        dtype = torch.float64
    return x.to(dtype)


def _transpose(inputs: Sequence[Tensor], out: Outputs) -> Tensor:
    """Transpose (x, perm); without a dumped ``perm`` (a constant MindSpore folded into the
    kernel), the one permutation that turns the input's shape into the output's."""
    x = inputs[0]
    if len(inputs) > 1:
        return x.permute(_ints(inputs[1]))
    found = {p for p in itertools.permutations(range(x.dim())) if [x.shape[i] for i in p] == out.shapes[0]}
    if len(found) != 1:
        raise ValueError(f"its perm was not dumped, and {len(found)} permutations fit the shapes")
    return x.permute(found.pop())


def _sparse_ce(inputs: Sequence[Tensor], out: Outputs) -> Tensor:
    """SparseSoftmaxCrossEntropyWithLogits (logits, labels): the mean loss, or (``is_grad``,
    an output shaped like the logits) its gradient with respect to the logits."""
    logits, labels = inputs[0], inputs[1].long()
    if out.shapes and list(out.shapes[0]) == list(logits.shape):
        onehot = F.one_hot(labels, logits.shape[-1]).to(logits.dtype)
        return (torch.softmax(logits, dim=-1) - onehot) / logits.shape[0]
    return F.cross_entropy(logits, labels)


def _bias_add_grad(inputs: Sequence[Tensor], _: Outputs) -> Tensor:
    """BiasAddGrad (dy, data_format): dy summed over every axis but the channel axis."""
    dy = inputs[0]
    fmt = _ints(inputs[1])[0] if len(inputs) > 1 and inputs[1].numel() else 0
    channel = dy.dim() - 1 if fmt == 1 or dy.dim() <= 2 else 1
    return dy.sum(dim=[a for a in range(dy.dim()) if a != channel])


def _gelu_grad(inputs: Sequence[Tensor], _: Outputs) -> Tensor:
    """GeLUGrad (dy, x, y): dy times the derivative of GeLU's tanh form at x."""
    dy, x = inputs[0], inputs[1].detach().requires_grad_(True)
    with torch.enable_grad():
        (dx,) = torch.autograd.grad(F.gelu(x, approximate="tanh"), x, dy)
    return dx


_REDUCERS: dict[str, Callable[..., Tensor]] = {
    "ReduceSum": lambda x, a, k: x.sum(dim=a, keepdim=k),
    "ReduceMean": lambda x, a, k: x.mean(dim=a, keepdim=k),
    "ReduceMax": lambda x, a, k: x.amax(dim=a, keepdim=k),
    "ReduceMin": lambda x, a, k: x.amin(dim=a, keepdim=k),
    "ReduceProd": lambda x, a, k: x.prod(dim=a, keepdim=k),
}

OPS: dict[str, Kernel] = {
    "MatMul": _matmul, "BatchMatMul": _matmul, "BiasAdd": _bias_add, "LayerNorm": _layer_norm,
    "Add": _binary(torch.add), "AddV2": _binary(torch.add), "Sub": _binary(torch.sub),
    "Mul": _binary(torch.mul), "RealDiv": _binary(torch.div), "Div": _binary(torch.div),
    "Maximum": _binary(torch.maximum), "Minimum": _binary(torch.minimum), "Pow": _binary(torch.pow),
    "SquaredDifference": _binary(lambda x, y: (x - y) ** 2),
    "AddN": lambda inputs, _: torch.stack(list(inputs)).sum(dim=0),
    "ReLU": _unary(torch.relu), "GeLU": _unary(lambda x: F.gelu(x, approximate="tanh")),
    "Sigmoid": _unary(torch.sigmoid), "Tanh": _unary(torch.tanh), "Exp": _unary(torch.exp),
    "Log": _unary(torch.log), "Sqrt": _unary(torch.sqrt), "Rsqrt": _unary(torch.rsqrt),
    "Square": _unary(torch.square), "Neg": _unary(torch.neg), "Abs": _unary(torch.abs),
    "Reciprocal": _unary(torch.reciprocal), "Erf": _unary(torch.erf),
    "Softmax": _softmax(torch.softmax), "LogSoftmax": _softmax(torch.log_softmax),
    **{name: _reduce(fn) for name, fn in _REDUCERS.items()},
    "Cast": _cast,
    "Reshape": lambda inputs, out: inputs[0].reshape(out.shapes[0]),
    "ExpandDims": lambda inputs, out: inputs[0].reshape(out.shapes[0]),
    "Squeeze": lambda inputs, out: inputs[0].reshape(out.shapes[0]),
    "Transpose": _transpose,
    "SparseSoftmaxCrossEntropyWithLogits": _sparse_ce,
    "BiasAddGrad": _bias_add_grad, "GeLUGrad": _gelu_grad,
}

# op types whose result depends on an attribute MindSpore keeps out of the dump (IR only)
ATTRIBUTES_NOT_DUMPED = {
    "LayerNormGrad": "depends on its epsilon, a kernel attribute the dump does not write (the forward "
                     "LayerNorm's epsilon input is not linked to it): not replayable",
}

# op types that update their inputs in place: MindSpore dumps the inputs after the update
UPDATES = frozenset("SGD Adam AdamWeightDecay ApplyMomentum ApplyAdam Assign AssignAdd AssignSub".split())


def why_not(op_type: str) -> str | None:
    """Why a MindSpore op type is not replayed, or None when the table has it."""
    if op_type in OPS:
        return None
    if op_type in ATTRIBUTES_NOT_DUMPED:
        return f"mindspore.{op_type} {ATTRIBUTES_NOT_DUMPED[op_type]}"
    if op_type in UPDATES:
        return (f"mindspore.{op_type} updates its inputs in place and MindSpore dumps them after the "
                "update: the values it read are gone")
    return (f"mindspore.{op_type} is not in opscope's MindSpore op table (opscope/replay/mindspore_ops.py); "
            f"register a torch equivalent with opscope.replay.register_replay('mindspore.{op_type}')")
