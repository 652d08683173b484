"""Which PyTorch ops an ONNX node stands for: a pure-data table for compare. No onnx, no torch.

Op names on each side
---------------------
- ONNX Runtime dumps name ops ``onnx::<OpType>`` for the default domain and
  ``<domain>::<OpType>`` otherwise (``com.microsoft::FusedMatMul``): see :func:`onnx_op_name`.
- PyTorch dumps name aten ops ``aten.addmm.default`` (or ``aten::addmm``) and torch API
  calls ``torch.nn.functional.linear``. :func:`torch_key` reduces every spelling to the
  overload packet (``aten.addmm``) or the API name, which is what the table holds.

How compare should use this module
----------------------------------
1. **Pair within a module.** Records of both dumps carry ``module`` paths of the same
   ``named_modules()`` tree. Inside one module (and phase), walk both op sequences in
   execution order (``seq``) and pair an ONNX node with a torch op only when
   :func:`corresponds` says so (sequence alignment with this as the match predicate;
   never pair two records just because they are at the same position).
2. **Decompositions.** Some opsets spell one torch op as several nodes (GELU as
   ``Div, Erf, Add, Mul, Mul`` before opset 20; LayerNorm as ``ReduceMean, Sub, Pow,
   ReduceMean, Add, Sqrt, Div, Mul, Add`` before opset 17). When a torch op is left
   unpaired and :func:`is_decomposition` accepts the ONNX nodes of the same module that
   are left between its paired neighbours, pair the torch op's *output* with the *last*
   of those nodes' output (and its inputs with the first nodes' inputs). The inner nodes
   (``Erf``, ``Pow``...) have no counterpart: report them as unpaired, never pair them
   with a torch op that happens to share a name (``Add`` inside a GELU is not
   ``aten.add`` of the residual connection).
3. **Folds.** :data:`FOLDED` lists torch ops that an exporter folds into the previous
   node: eval-mode ``BatchNorm`` into the preceding ``Conv`` (the Conv weight and bias
   are then a new initializer with no PyTorch parameter name — its ``param`` row has
   ``param`` empty and a ``note`` saying "derived initializer"). The ONNX ``Conv``
   output then corresponds to the torch ``batch_norm`` output, not to the torch
   ``conv2d`` output, which is left unpaired. Pair that way when the torch conv's output
   feeds (data flow, ``producer``) a folded op and the ONNX conv's weight is derived.
4. **Runtime-internal nodes.** :data:`NO_COUNTERPART` ops (``Constant``, ``Shape``,
   ``Cast`` inserted by a converter, ``Identity`` of a shared weight...) are bookkeeping:
   leave them unpaired and judge them as identities if they carry data.
5. **ORT fusions.** With ``opt_level`` above ``disable`` the dump holds ONNX Runtime's
   fused nodes (``Gemm`` from MatMul+Add, ``com.microsoft::FusedMatMul`` with a folded
   transpose and scale, ``LayerNormalization`` from its decomposition); :data:`FUSED`
   lists the torch ops each may cover, so a fused node pairs with the *last* torch op of
   the group it covers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

DEFAULT_DOMAINS = ("", "ai.onnx")

# ONNX op type (default domain) -> torch ops (overload packets / API names) it stands for.
ONNX_TO_TORCH: dict[str, frozenset[str]] = {k: frozenset(v) for k, v in {
    # linear algebra
    "Gemm": ("aten.addmm", "aten.mm", "aten.linear", "aten.matmul", "torch.nn.functional.linear",
             "torch.matmul", "torch.mm", "torch.addmm"),
    "MatMul": ("aten.mm", "aten.bmm", "aten.matmul", "aten.linear", "aten.addmm", "aten.baddbmm",
               "aten.einsum", "torch.matmul", "torch.mm", "torch.bmm", "torch.einsum",
               "torch.nn.functional.linear", "torch.Tensor.__matmul__"),
    "Einsum": ("aten.einsum", "aten.bmm", "aten.mm", "aten.matmul", "torch.einsum"),
    "Conv": ("aten.convolution", "aten.conv1d", "aten.conv2d", "aten.conv3d", "aten._convolution",
             "torch.nn.functional.conv1d", "torch.nn.functional.conv2d", "torch.nn.functional.conv3d"),
    "ConvTranspose": ("aten.convolution", "aten.conv_transpose1d", "aten.conv_transpose2d",
                      "aten.conv_transpose3d", "torch.nn.functional.conv_transpose2d"),
    # activations
    "Relu": ("aten.relu", "aten.relu_", "aten.threshold", "torch.relu", "torch.nn.functional.relu"),
    "Gelu": ("aten.gelu", "torch.nn.functional.gelu"),
    "Sigmoid": ("aten.sigmoid", "torch.sigmoid", "torch.nn.functional.sigmoid"),
    "Tanh": ("aten.tanh", "torch.tanh", "torch.nn.functional.tanh"),
    "LeakyRelu": ("aten.leaky_relu", "torch.nn.functional.leaky_relu"),
    "Elu": ("aten.elu", "torch.nn.functional.elu"),
    "Selu": ("aten.selu", "torch.nn.functional.selu"),
    "Softplus": ("aten.softplus", "torch.nn.functional.softplus"),
    "HardSigmoid": ("aten.hardsigmoid", "torch.nn.functional.hardsigmoid"),
    "HardSwish": ("aten.hardswish", "torch.nn.functional.hardswish"),
    "Mish": ("aten.mish", "torch.nn.functional.mish"),
    "Softmax": ("aten.softmax", "aten._softmax", "torch.softmax", "torch.nn.functional.softmax"),
    "LogSoftmax": ("aten.log_softmax", "aten._log_softmax", "torch.nn.functional.log_softmax"),
    # normalisation
    "LayerNormalization": ("aten.layer_norm", "aten.native_layer_norm", "torch.nn.functional.layer_norm"),
    "BatchNormalization": ("aten.batch_norm", "aten._native_batch_norm_legit_no_training",
                           "aten.native_batch_norm", "aten._native_batch_norm_legit",
                           "aten.cudnn_batch_norm", "torch.nn.functional.batch_norm"),
    "InstanceNormalization": ("aten.instance_norm", "torch.nn.functional.instance_norm"),
    "GroupNormalization": ("aten.group_norm", "aten.native_group_norm", "torch.nn.functional.group_norm"),
    "RMSNormalization": ("aten.rms_norm", "torch.nn.functional.rms_norm"),
    # elementwise arithmetic
    "Add": ("aten.add", "aten.add_", "torch.add", "torch.Tensor.__add__", "torch.Tensor.add"),
    "Sub": ("aten.sub", "aten.sub_", "aten.rsub", "torch.sub", "torch.Tensor.__sub__", "torch.Tensor.__rsub__"),
    "Mul": ("aten.mul", "aten.mul_", "torch.mul", "torch.Tensor.__mul__", "torch.Tensor.__rmul__"),
    "Div": ("aten.div", "aten.div_", "torch.div", "torch.Tensor.__truediv__", "torch.Tensor.__rtruediv__"),
    "Pow": ("aten.pow", "aten.square", "torch.pow", "torch.Tensor.__pow__"),
    "Sqrt": ("aten.sqrt", "torch.sqrt"),
    "Reciprocal": ("aten.reciprocal", "aten.rsqrt", "torch.reciprocal"),
    "Exp": ("aten.exp", "torch.exp"),
    "Log": ("aten.log", "torch.log"),
    "Erf": ("aten.erf", "torch.erf", "torch.special.erf"),
    "Neg": ("aten.neg", "torch.neg", "torch.Tensor.__neg__"),
    "Abs": ("aten.abs", "torch.abs"),
    "Sin": ("aten.sin", "torch.sin"),
    "Cos": ("aten.cos", "torch.cos"),
    "Max": ("aten.maximum", "aten.clamp_min", "torch.maximum"),
    "Min": ("aten.minimum", "aten.clamp_max", "torch.minimum"),
    "Clip": ("aten.clamp", "aten.clip", "aten.hardtanh", "torch.clamp", "torch.nn.functional.hardtanh"),
    "Where": ("aten.where", "aten.masked_fill", "torch.where"),
    "Equal": ("aten.eq", "torch.eq"),
    "Less": ("aten.lt", "torch.lt"),
    "Greater": ("aten.gt", "torch.gt"),
    "Not": ("aten.logical_not", "aten.bitwise_not", "torch.logical_not"),
    # reductions
    "ReduceSum": ("aten.sum", "torch.sum"),
    "ReduceMax": ("aten.amax", "aten.max", "torch.amax", "torch.max"),
    "ReduceMin": ("aten.amin", "aten.min", "torch.amin", "torch.min"),
    "ReduceL2": ("aten.linalg_vector_norm", "aten.norm", "torch.norm"),
    "ArgMax": ("aten.argmax", "torch.argmax"),
    "CumSum": ("aten.cumsum", "torch.cumsum"),
    # pooling
    "MaxPool": ("aten.max_pool2d", "aten.max_pool2d_with_indices", "aten.max_pool1d", "torch.nn.functional.max_pool2d"),
    "AveragePool": ("aten.avg_pool2d", "aten.avg_pool1d", "torch.nn.functional.avg_pool2d"),
    "GlobalAveragePool": ("aten.adaptive_avg_pool2d", "aten.mean", "torch.nn.functional.adaptive_avg_pool2d"),
    "ReduceMean": ("aten.mean", "aten.adaptive_avg_pool2d", "torch.mean"),  # dynamo: AdaptiveAvgPool2d(1)
    "GlobalMaxPool": ("aten.adaptive_max_pool2d", "aten.amax"),
    # data movement (same elements, no arithmetic)
    "Reshape": ("aten.view", "aten.reshape", "aten._unsafe_view", "aten.flatten", "aten.unflatten",
                "torch.reshape", "torch.Tensor.view", "torch.flatten"),
    "Flatten": ("aten.flatten", "aten.view", "aten.reshape", "torch.flatten"),
    "Transpose": ("aten.transpose", "aten.permute", "aten.t", "aten.numpy_T", "torch.transpose",
                  "torch.Tensor.permute", "torch.Tensor.transpose"),
    "Squeeze": ("aten.squeeze", "torch.squeeze"),
    "Unsqueeze": ("aten.unsqueeze", "torch.unsqueeze"),
    "Expand": ("aten.expand", "aten.expand_as", "torch.Tensor.expand"),
    "Concat": ("aten.cat", "aten.concat", "aten.stack", "torch.cat", "torch.stack"),
    "Split": ("aten.split", "aten.split_with_sizes", "aten.chunk", "aten.unbind", "torch.split", "torch.chunk"),
    "Slice": ("aten.slice", "aten.narrow", "aten.split", "aten.chunk", "aten.select", "torch.narrow"),
    "Gather": ("aten.index_select", "aten.select", "aten.embedding", "aten.index", "torch.index_select",
               "torch.nn.functional.embedding"),
    "GatherElements": ("aten.gather", "torch.gather"),
    "ScatterND": ("aten.index_put", "aten.index_put_", "aten.slice_scatter", "aten.select_scatter"),
    "Tile": ("aten.repeat", "aten.tile"),
    "Pad": ("aten.constant_pad_nd", "aten.pad", "torch.nn.functional.pad"),
    "Resize": ("aten.upsample_nearest2d", "aten.upsample_bilinear2d", "torch.nn.functional.interpolate"),
    "Dropout": ("aten.dropout", "aten.native_dropout", "torch.nn.functional.dropout"),
    "Identity": ("aten.clone", "aten.alias", "aten.detach", "aten.contiguous", "aten.dropout"),
    "Cast": ("aten._to_copy", "aten.to", "torch.Tensor.to", "torch.Tensor.float", "torch.Tensor.half"),
    "Trilu": ("aten.triu", "aten.tril"),
    "TopK": ("aten.topk", "torch.topk"),
}.items()}

# Torch ops that some opsets export as several nodes: the node types such a group may hold
# (Constant/Cast/Identity aside). Opset where the single node appears in brackets.
DECOMPOSITIONS: dict[str, frozenset[str]] = {k: frozenset(v) for k, v in {
    "aten.gelu": ("Div", "Erf", "Add", "Mul", "Pow", "Tanh"),                # Gelu (20)
    "torch.nn.functional.gelu": ("Div", "Erf", "Add", "Mul", "Pow", "Tanh"),
    "aten.layer_norm": ("ReduceMean", "Sub", "Pow", "Mul", "Add", "Sqrt", "Div", "Reciprocal"),  # (17)
    "aten.native_layer_norm": ("ReduceMean", "Sub", "Pow", "Mul", "Add", "Sqrt", "Div", "Reciprocal"),
    "torch.nn.functional.layer_norm": ("ReduceMean", "Sub", "Pow", "Mul", "Add", "Sqrt", "Div", "Reciprocal"),
    "aten.rms_norm": ("Pow", "ReduceMean", "Add", "Sqrt", "Reciprocal", "Div", "Mul"),  # (23)
    "aten.group_norm": ("Reshape", "InstanceNormalization", "Mul", "Add"),
    "aten.linear": ("MatMul", "Add", "Transpose"),                            # Gemm for 2-D input
    "torch.nn.functional.linear": ("MatMul", "Add", "Transpose"),
    "aten.addmm": ("MatMul", "Add", "Mul"),
    "aten.softmax": ("Exp", "ReduceSum", "Div", "ReduceMax", "Sub"),
    "aten.log_softmax": ("Exp", "ReduceSum", "Log", "Sub", "ReduceMax"),
    "aten.silu": ("Sigmoid", "Mul"),
    "aten.hardswish": ("HardSigmoid", "Mul"),
    "aten.scaled_dot_product_attention": ("MatMul", "Mul", "Div", "Softmax", "Transpose", "Add", "Sqrt"),
    "aten.mean": ("ReduceSum", "Div"),
    "aten.var": ("ReduceMean", "Sub", "Mul", "Div", "Pow"),
}.items()}

# Torch op -> ONNX op types it is folded into by exporters (no node of its own in ONNX).
FOLDED: dict[str, frozenset[str]] = {k: frozenset(v) for k, v in {
    "aten.batch_norm": ("Conv", "ConvTranspose", "Gemm"),
    "aten._native_batch_norm_legit_no_training": ("Conv", "ConvTranspose", "Gemm"),
    "aten.native_batch_norm": ("Conv", "ConvTranspose", "Gemm"),
    "aten.cudnn_batch_norm": ("Conv", "ConvTranspose"),
    "torch.nn.functional.batch_norm": ("Conv", "ConvTranspose", "Gemm"),
}.items()}

# ONNX Runtime's fused and contrib nodes -> the torch ops of the group they cover.
FUSED: dict[str, frozenset[str]] = {k: frozenset(v) for k, v in {
    "com.microsoft::FusedMatMul": ("aten.matmul", "aten.mm", "aten.bmm", "aten.transpose", "aten.mul",
                                   "aten.div", "aten.linear"),
    "com.microsoft::FusedGemm": ("aten.addmm", "aten.linear", "aten.relu", "aten.gelu"),
    "com.microsoft::FusedConv": ("aten.convolution", "aten.conv2d", "aten.conv1d", "aten.relu",
                                 "aten.batch_norm", "aten._native_batch_norm_legit_no_training"),
    "com.microsoft::Gelu": ("aten.gelu",),
    "com.microsoft::FastGelu": ("aten.gelu", "aten.add"),
    "com.microsoft::BiasGelu": ("aten.gelu", "aten.add", "aten.linear", "aten.addmm"),
    "com.microsoft::SkipLayerNormalization": ("aten.add", "aten.layer_norm", "aten.native_layer_norm"),
    "com.microsoft::SimplifiedLayerNormalization": ("aten.rms_norm",),
    "com.microsoft::BiasSoftmax": ("aten.add", "aten.softmax"),
    "com.microsoft::Attention": ("aten.linear", "aten.matmul", "aten.softmax",
                                 "aten.scaled_dot_product_attention"),
    "com.microsoft::MultiHeadAttention": ("aten.scaled_dot_product_attention", "aten.matmul", "aten.softmax"),
    "com.microsoft.nchwc::Conv": ("aten.convolution", "aten.conv2d"),
    "onnx::Gemm": ("aten.linear", "aten.addmm", "aten.matmul", "aten.add"),
    "onnx::LayerNormalization": ("aten.layer_norm", "aten.native_layer_norm"),
}.items()}

# Bookkeeping nodes with no torch counterpart by design: leave unpaired.
NO_COUNTERPART: frozenset[str] = frozenset({
    "Constant", "ConstantOfShape", "Shape", "Size", "Range", "Identity", "Cast", "CastLike",
    "com.microsoft.nchwc::ReorderInput", "com.microsoft.nchwc::ReorderOutput",
    "com.microsoft::MemcpyToHost", "com.microsoft::MemcpyFromHost",
})

# Ops that keep every element in place (a reshape, a copy, a cast): one that runs on one side
# only can be judged as an identity between its input and its output. Transposes, slices and
# broadcasts are not (their output is another arrangement of the elements).
ORDER_PRESERVING: frozenset[str] = frozenset({
    "aten.view", "aten._unsafe_view", "aten.reshape", "aten.flatten", "aten.unflatten", "aten.squeeze",
    "aten.unsqueeze", "aten.clone", "aten.contiguous", "aten.alias", "aten.detach", "aten.dropout",
    "aten._to_copy", "aten.to", "aten.lift_fresh", "aten.expand",
    "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Cast", "CastLike", "Dropout", "Expand",
    "Unflatten",  # module level: class names (Flatten, Dropout, Identity as above)
})

_ATEN = re.compile(r"^(?:torch\.ops\.)?aten(?:\.|::)([A-Za-z0-9_]+)")
# torch API spellings: torch.add, torch.nn.functional.gelu, Tensor.add, torch.Tensor.__add__
_API = re.compile(r"^(?:torch\.(?:nn\.functional\.|special\.|linalg\.)?|(?:torch\.)?Tensor\.)([A-Za-z0-9_]+)$")
_DUNDER = {"matmul": "matmul", "rmatmul": "matmul", "add": "add", "radd": "add", "iadd": "add_",
           "sub": "sub", "rsub": "rsub", "isub": "sub_", "mul": "mul", "rmul": "mul", "imul": "mul_",
           "truediv": "div", "rtruediv": "div", "itruediv": "div_", "pow": "pow", "neg": "neg",
           "getitem": "index"}


def onnx_op_name(domain: str, op_type: str) -> str:
    """The ``op`` column of an ONNX Runtime record: ``onnx::Gemm``, ``com.microsoft::FusedMatMul``."""
    return f"onnx::{op_type}" if domain in DEFAULT_DOMAINS else f"{domain}::{op_type}"


def split_onnx_op(op: str) -> tuple[str, str]:
    """``(domain, op_type)`` of an ``op`` column value; the default domain is ``""``."""
    domain, _, op_type = op.rpartition("::")
    return ("" if domain in ("onnx", "ai.onnx") else domain), op_type


def torch_key(op: str) -> str:
    """One spelling per torch op: ``aten::addmm``, ``aten.addmm.default`` -> ``aten.addmm``."""
    m = _ATEN.match(op)
    if m:
        name = m.group(1)
        return f"aten.{name}"
    return op


def torch_keys(op: str) -> frozenset[str]:
    """Every table key a torch op name may be listed under: ``Tensor.matmul`` ->
    {``Tensor.matmul``, ``aten.matmul``}; ``torch.Tensor.__truediv__`` -> {..., ``aten.div``}."""
    key = torch_key(op)
    m = _API.match(key)
    if not m:
        return frozenset({key})
    base = m.group(1)
    if base.startswith("__") and base.endswith("__"):
        base = _DUNDER.get(base.strip("_"), base.strip("_"))
    return frozenset({key, f"aten.{base}"})


def _onnx_key(onnx_op: str) -> str:
    domain, op_type = split_onnx_op(onnx_op) if "::" in onnx_op else ("", onnx_op)
    return op_type if domain == "" else f"{domain}::{op_type}"


def torch_ops_for(onnx_op: str) -> frozenset[str]:
    """Every torch op an ONNX node (``onnx::Gemm``, ``Gemm`` or a fused ``domain::Op``) may stand for."""
    key = _onnx_key(onnx_op)
    out = set(ONNX_TO_TORCH.get(key, ()))
    out |= FUSED.get(key if "::" in key else f"onnx::{key}", frozenset())
    out |= {t for t, targets in FOLDED.items() if key in targets}
    return frozenset(out)


def corresponds(onnx_op: str, torch_op: str) -> bool:
    """True when the ONNX node may compute what the torch op computes (its output may be paired)."""
    return not torch_keys(torch_op).isdisjoint(torch_ops_for(onnx_op))


def is_internal(onnx_op: str) -> bool:
    """True for bookkeeping nodes that have no torch counterpart (:data:`NO_COUNTERPART`)."""
    return _onnx_key(onnx_op) in NO_COUNTERPART


def is_decomposition(torch_op: str, onnx_ops: Iterable[str]) -> bool:
    """True when the ONNX nodes ``onnx_ops`` (in order) can be an exported decomposition of ``torch_op``.

    Bookkeeping nodes are ignored; at least two arithmetic nodes must remain, all of them
    in the torch op's :data:`DECOMPOSITIONS` set.
    """
    allowed = frozenset().union(*(DECOMPOSITIONS.get(k, frozenset()) for k in torch_keys(torch_op)))
    if not allowed:
        return False
    ops = [_onnx_key(o) for o in onnx_ops if not is_internal(o)]
    return len(ops) >= 2 and all(o in allowed for o in ops)


def is_fusion(onnx_op: str, torch_ops: Iterable[str]) -> bool:
    """True when one ONNX node (an ORT fusion such as ``com.microsoft::FusedMatMul``, or a
    ``Gemm`` made from MatMul+Add) can stand for the torch ops ``torch_ops`` (in order).

    Element-preserving torch ops (views, :data:`ORDER_PRESERVING`) in between are ignored;
    at least two others must remain, all of them in the node's :data:`FUSED` set, and the
    last one must be one of them (the fused node's output is the last op's output).
    """
    key = _onnx_key(onnx_op)
    covered = FUSED.get(key if "::" in key else f"onnx::{key}")
    if not covered:
        return False
    ops = list(torch_ops)
    if not ops or preserves_order(ops[-1]):
        return False
    core = [o for o in ops if not preserves_order(o)]
    return len(core) >= 2 and all(not torch_keys(o).isdisjoint(covered) for o in core)


def preserves_order(op: str) -> bool:
    """True for ops whose output holds their input's elements in the same order (:data:`ORDER_PRESERVING`):
    ``aten.view``, ``Tensor.reshape``, ``onnx::Reshape``, ``onnx::Cast``, a ``Flatten`` module..."""
    if "::" in op and not op.startswith("aten::"):
        return _onnx_key(op) in ORDER_PRESERVING
    return not torch_keys(op).isdisjoint(ORDER_PRESERVING)
