"""Conditioning: how much an op may magnify its inputs' relative error, by op.

The verdict allows an output ``ratio`` times its inputs' relative error. For most ops that
is enough; for some, the output's error relative to the *output* can be far larger than
the input's relative to the *input*, with nothing wrong:

- a sum or mean whose terms cancel (and a sum by index: an embedding's weight gradient, a
  relative position bias table's): summing r elements gives |Δout| <= sqrt(r)·|Δin|, so
  relative to the output the input's error counts ||in||·sqrt(r)/||out|| times (a bias
  gradient summed over a batch; the mean a layer norm saves for backward);
- a normalization (layer, batch, group norm) works on the input less its mean, so an
  input whose mean is large beside its spread has its error magnified ||x|| / ||x - mean||
  times in the normalized output and in the saved inverse standard deviation;
- the pieces of a batch norm that a framework runs as separate ops (Keras 3 on TensorFlow:
  ``SquaredDifference`` of the input and its mean, ``Rsqrt`` and its gradient
  ``RsqrtGrad``, a cube of the inverse standard deviation), with the same cancellation and
  powers inside;
- a contraction (a matmul, a convolution and their backward's gradients): each output sums
  products of the two operands, |ΔC| <= Σ|a||b|·(εa + εb), and ||(|A||B|)|| <= ||A||·||B||,
  so terms that cancel (a weight gradient summed over a few positions: ResNet's shortcut
  convolution with micro-batches of two) magnify the operands' relative error up to
  ||A||·||B|| / ||C|| times;
- CTC's forward-backward recursion over the T frames of its log-probabilities: an error in
  one frame enters every later step's log-sum-exp, so the loss and its gradient may carry
  up to T times the inputs' relative error (Wav2Vec2 with one thread against two);
- an activation's backward that keeps part of the gradient (ReLU's, ReLU6's, ELU's: each
  element times a factor in [0, 1]): an error sitting where the mask keeps the gradient
  counts ||g|| / ||out|| times relative to the output. (An element that flips because the
  features moved across the threshold is a decision, not covered here.)
- a selection (a slice, an index, a gather, a split's part): its elements are some of its
  input's, and those can hold more than their share of its error: ||in|| / ||out||.
- log-softmax's backward, ``g - exp(y)·Σg``: an error of the log-probabilities ``y`` is
  absolute in ``exp(y)``, while ``y`` is far from zero (−log C on average), so it counts
  up to exp(max y)·||y||·|Σg| / ||out|| times (Mamba under bf16 autocast, 1.6x over before).

Each rule is a function of the call's rows (their statistics) and registers for op names
with :func:`register_condition`; a name registered twice is refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from opscope.compare.flow import base_op
from opscope.compare.pair import INPUT_IO

Row = dict[str, Any]
ConditionRule = Callable[[list[Row], Row, float], float]
CONDITION_RULES: dict[str, ConditionRule] = {}


def register_condition(*ops: str) -> Callable[[ConditionRule], ConditionRule]:
    """Register ``fn(input_rows, output_row, output_reference_norm) -> factor >= 1`` for
    the base op names given (``sum``, not ``aten.sum.dim_IntList``), or another framework's
    own op name (``SquaredDifference`` for ``tf.SquaredDifference``), which is looked up
    first."""
    def wrap(fn: ConditionRule) -> ConditionRule:
        for op in ops:
            if op in CONDITION_RULES:
                raise ValueError(f"a conditioning rule for {op!r} is already registered")
            CONDITION_RULES[op] = fn
        return fn
    return wrap


def condition(rows: list[Row], out_row: Row, out_norm: float) -> float:
    """The factor by which this call's output may magnify its inputs' relative error."""
    op = str(out_row.get("op") or "")
    name = base_op(op)
    rule = CONDITION_RULES.get(op.rsplit(".", 1)[-1]) or CONDITION_RULES.get(name)
    if rule is None and ("sum" in name or "mean" in name):
        rule = reduction
    if rule is None:
        return 1.0
    inputs = [r for r in rows if r.get("io") in INPUT_IO]
    factor = rule(inputs, out_row, out_norm)
    return factor if math.isfinite(factor) and factor > 1.0 else 1.0


def reduction(inputs: list[Row], out_row: Row, out_norm: float) -> float:
    """||in||·sqrt(r)/||out||: a sum or mean over r elements whose terms cancel."""
    out_numel = out_row.get("numel") or 0
    bigger = [r for r in inputs if (r.get("numel") or 0) > out_numel]
    return _summed(bigger, out_numel, out_norm)


def _summed(terms: list[Row], out_numel: int, out_norm: float) -> float:
    """||t||·sqrt(max(1, n_t / n_out))/||out|| for the largest of ``terms`` (1 without one)."""
    if not terms or out_norm <= 0 or out_numel <= 0:
        return 1.0
    big = max(terms, key=lambda r: r.get("numel") or 0)
    norm = _num(big.get("norm"))
    if not math.isfinite(norm) or norm <= 0:
        return 1.0
    return norm * math.sqrt(max(1.0, (big.get("numel") or 0) / out_numel)) / out_norm


@register_condition("native_layer_norm", "native_batch_norm", "_native_batch_norm_legit",
                    "_native_batch_norm_legit_functional", "_native_batch_norm_legit_no_training",
                    "native_group_norm", "layer_norm", "batch_norm", "group_norm",
                    "instance_norm")
def normalization(inputs: list[Row], out_row: Row, out_norm: float) -> float:
    """Slot 1 (the saved mean) is a reduction; the others see ||x|| / ||x - mean||."""
    if not inputs:
        return 1.0
    if out_row.get("slot") == 1:
        return reduction(inputs, out_row, out_norm)
    x = max(inputs, key=lambda r: r.get("numel") or 0)
    norm, std, n = _num(x.get("norm")), _num(x.get("std")), x.get("numel") or 0
    if not (math.isfinite(norm) and math.isfinite(std)) or std <= 0 or n <= 0:
        return 1.0
    return norm / (std * math.sqrt(n))


def _num(value: Any) -> float:
    try:
        return float(value) if value is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


@register_condition("embedding_dense_backward", "embedding_backward", "_embedding_bag_backward",
                    "_embedding_bag_dense_backward", "index_put_", "_index_put_impl_", "index_put",
                    "index_add", "index_add_", "scatter_add", "scatter_add_", "scatter_reduce",
                    "scatter_reduce_", "UnsortedSegmentSum")
def sum_by_index(inputs: list[Row], out_row: Row, out_norm: float) -> float:
    """A sum by index (a scatter-add): an output row that sums k values has an error of at
    most sqrt(k) times theirs, so sqrt(k_max)·||values||/||out||. k_max is bounded by the
    indices: n of them into d distinct rows (the output's rows that are not zero) put at most
    n - d + 1 in one. An embedding's weight gradient sums its rows' gradients by token, a
    masked language model's mask token a third of them (DeBERTa, its micro-batches); Swin's
    relative position bias table sums the attention scores' gradients by offset. Without an
    index input: the values per non-zero output element, as a reduction."""
    floats = [r for r in inputs if str(r.get("dtype") or "").startswith(("float", "bfloat"))]
    indices = [r for r in inputs if str(r.get("dtype") or "").startswith(("int", "uint"))]
    zeros = _num(out_row.get("zeros"))
    nonzero = (out_row.get("numel") or 0) - (int(zeros) if math.isfinite(zeros) else 0)
    if not indices or not floats or nonzero <= 0 or out_norm <= 0:
        return _summed(floats, nonzero, out_norm)
    shape = list(out_row.get("shape") or [])
    width = int(shape[-1]) if len(shape) >= 2 and int(shape[-1]) > 0 else 1
    n = max(int(r.get("numel") or 0) for r in indices)
    most = max(1, n - max(1, nonzero // width) + 1)
    norm = _num(max(floats, key=lambda r: r.get("numel") or 0).get("norm"))
    return norm * math.sqrt(most) / out_norm if math.isfinite(norm) and norm > 0 else 1.0


@register_condition("mul", "mul_")
def product(inputs: list[Row], out_row: Row, out_norm: float) -> float:
    """a ⊙ b: ||Δ(ab)|| <= ||Δa||·max|b| + max|a|·||Δb|| (a broadcast input's error repeats),
    so where b weighs a's rows unevenly (an inverse RMS cubed in a norm's backward) the
    product's relative error is out of proportion to each factor's. Two tensors only: a
    scalar factor scales error and value alike."""
    factors = [r for r in inputs if (r.get("numel") or 0) > 1]
    if len(factors) != 2 or out_norm <= 0:
        return 1.0
    n_out = out_row.get("numel") or 0
    total = 0.0
    for mine, other in (factors, factors[::-1]):
        norm, absmax, n = _num(mine.get("norm")), _num(other.get("absmax")), mine.get("numel") or 0
        if not (math.isfinite(norm) and math.isfinite(absmax)) or n <= 0:
            return 1.0
        total += norm * absmax * math.sqrt(max(1.0, n_out / n)) / out_norm
    return total


def _stats(row: Row) -> tuple[float, float, int]:
    """(norm, absmax, numel) of a row; NaN where not recorded."""
    return _num(row.get("norm")), _num(row.get("absmax")), int(row.get("numel") or 0)


@register_condition("SquaredDifference")
def squared_difference(inputs: list[Row], out_row: Row, out_norm: float) -> float:
    """(a - b)², b often a broadcast mean: the difference cancels, ||Δ(a-b)|| <= e·(||a|| +
    ||b||·sqrt(n_out/n_b)), and squaring weighs it by 2·max|a-b| = 2·sqrt(max out)."""
    if len(inputs) != 2 or out_norm <= 0:
        return 1.0
    (na, _, ca), (nb, _, cb) = (_stats(r) for r in sorted(inputs, key=lambda r: r.get("slot") or 0))
    _, out_max, n_out = _stats(out_row)
    if min(ca, cb, n_out) <= 0 or not all(map(math.isfinite, (na, nb, out_max))):
        return 1.0
    return 2.0 * math.sqrt(max(out_max, 0.0)) * (na * math.sqrt(n_out / ca) + nb * math.sqrt(n_out / cb)) / out_norm


@register_condition("RsqrtGrad")
def rsqrt_grad(inputs: list[Row], out_row: Row, out_norm: float) -> float:
    """RsqrtGrad(y, dy) = -dy·y³/2: ||Δout|| <= (||Δdy||·max|y|³ + 3·max|y|²·max|dy|·||Δy||)/2."""
    by_slot = {r.get("slot"): r for r in inputs}
    if 0 not in by_slot or 1 not in by_slot or out_norm <= 0:
        return 1.0
    (ny, my, _), (nd, md, _) = _stats(by_slot[0]), _stats(by_slot[1])
    if not all(map(math.isfinite, (ny, my, nd, md))):
        return 1.0
    return 0.5 * (nd * my**3 + 3.0 * my**2 * md * ny) / out_norm


@register_condition("threshold_backward", "hardtanh_backward", "Relu6Grad", "EluGrad", "LeakyReluGrad")
def masked_gradient(inputs: list[Row], out_row: Row, out_norm: float) -> float:
    """out = g ⊙ s with every |s| <= 1 (a mask, ELU's slope, a leaky slope below 1):
    ||Δout|| <= ||Δg||, so the output's relative error is at most ||g|| / ||out|| times g's."""
    grad = next((r for r in inputs if r.get("slot") == 0), None)
    norm = _num(grad.get("norm")) if grad is not None else math.nan
    if not math.isfinite(norm) or out_norm <= 0:
        return 1.0
    return norm / out_norm


_POWERS = {"rsqrt": -0.5, "reciprocal": -1.0, "sqrt": 0.5}


# output slot -> the input slots of its two operands
_OPERANDS: dict[str, dict[int, tuple[int, int]]] = {
    # (einsum of two operands, as the API level records it: a sum over products of one element of
    # each, each pair taken once, so ||C|| <= ||A||·||B|| as for a matmul; Funnel's and XLNet's
    # relative attention)
    **dict.fromkeys(("mm", "bmm", "matmul", "__matmul__", "linear", "convolution", "_convolution",
                     "conv1d", "conv2d", "conv3d", "Linear", "Conv1d", "Conv2d", "Conv3d", "einsum"), {0: (0, 1)}),
    **dict.fromkeys(("addmm", "baddbmm", "addbmm"), {0: (1, 2)}),
    # (grad_output, input, weight) -> grad_input from grad_output and weight, grad_weight from
    # grad_output and input (grad_bias, slot 2, is a sum: the reduction rule's)
    "convolution_backward": {0: (0, 2), 1: (0, 1)},
}


@register_condition(*_OPERANDS)
def contraction(inputs: list[Row], out_row: Row, out_norm: float) -> float:
    """||A||·||B|| / ||C|| for the output's two operands (1 where they are not recorded)."""
    slot = int(out_row.get("slot") or 0)
    operands = _OPERANDS.get(base_op(str(out_row.get("op") or "")), {}).get(slot)
    if operands is None:
        return reduction(inputs, out_row, out_norm) if slot == 2 else 1.0
    by_slot = {r.get("slot"): r for r in inputs}
    rows = [by_slot.get(i) for i in operands]
    if any(r is None for r in rows) or out_norm <= 0:
        return 1.0
    a, b = (_num(r.get("norm")) for r in rows if r is not None)
    return a * b / out_norm if math.isfinite(a) and math.isfinite(b) else 1.0


@register_condition("_ctc_loss", "_ctc_loss_backward", "ctc_loss", "CTCLoss", "CTCLossV2")
def recurrence(inputs: list[Row], out_row: Row, out_norm: float) -> float:
    """T, the frames of the log-probabilities ([T, N, C], the first input of rank 3)."""
    frames = next((r for r in inputs if len(r.get("shape") or ()) == 3), None)
    return float(frames["shape"][0]) if frames is not None else 1.0


@register_condition("rsqrt", "reciprocal", "sqrt", "pow", "rsqrt_", "reciprocal_", "sqrt_", "pow_")
def power(inputs: list[Row], out_row: Row, out_norm: float) -> float:
    """y = x^p element by element: |Δy| ≈ |p|·|x|^(p-1)·|Δx|, so relative to ||y|| the input's
    relative error counts |p|·m^(p-1)·||x||/||y|| times, m the smallest |x| where p < 1 (an
    inverse RMS: the rows of smallest variance weigh most in the output, least in the input)
    and the largest where p > 1. An input that crosses zero has no bound: none is given."""
    p = _POWERS.get(base_op(out_row.get("op")).rstrip("_")) or _exponent(out_row)  # (in place: rsqrt_)
    x = next((r for r in inputs if r.get("slot") == 0), None)
    if p is None or x is None or out_norm <= 0:
        return 1.0
    norm, low, high = _num(x.get("norm")), _num(x.get("min")), _num(x.get("max"))
    if not all(map(math.isfinite, (norm, low, high))):
        return 1.0
    if p < 1:
        if low <= 0 <= high:
            return 1.0
        m = min(abs(low), abs(high))
    else:
        m = max(abs(low), abs(high))
    return abs(p) * m ** (p - 1) * norm / out_norm


def _exponent(row: Row) -> float | None:
    """The scalar exponent of ``pow.Tensor_Scalar`` (its argument 1), if recorded."""
    import json

    try:
        args = json.loads(row.get("args") or "{}").get("args") or []
    except (ValueError, AttributeError):
        return None
    for position, value in args:
        if position == 1 and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


@register_condition("slice", "select", "narrow", "index", "index_select", "gather",
                    "masked_select", "take", "take_along_dim", "split", "split_with_sizes", "chunk",
                    "unbind", "diagonal", "__getitem__", "unfold")
def selection(inputs: list[Row], out_row: Row, out_norm: float) -> float:
    """||in|| / ||out||: the output is a part of its first input's elements, and the part
    can hold more than its share of the error (the KV-cache rows of the tokens two
    generations chose differently)."""
    source = next((r for r in inputs if r.get("slot") == 0), None)
    norm = _num(source.get("norm")) if source is not None else math.nan
    if not math.isfinite(norm) or out_norm <= 0:
        return 1.0
    return norm / out_norm


@register_condition("_log_softmax_backward_data", "log_softmax_backward_data")
def log_softmax_backward(inputs: list[Row], out_row: Row, out_norm: float) -> float:
    """exp(max y)·||y||·|Σg| / ||out||, y the saved output (slot 1), g the gradient (slot 0):
    δout = −exp(y)·δy·Σg. The losses read from log-probabilities (cross-entropy, with label
    smoothing, KL divergence) give each row gradients that sum to about the largest of them,
    which stands for |Σg|."""
    g = next((r for r in inputs if r.get("slot") == 0), None)
    y = next((r for r in inputs if r.get("slot") == 1), None)
    if g is None or y is None or out_norm <= 0:
        return 1.0
    top, norm, grad = _num(y.get("max")), _num(y.get("norm")), _num(g.get("absmax"))
    if not all(map(math.isfinite, (top, norm, grad))):
        return 1.0
    return math.exp(min(top, 0.0)) * norm * grad / out_norm
