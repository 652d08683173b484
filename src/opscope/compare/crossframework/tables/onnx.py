"""The ONNX (Runtime) op table: which PyTorch ops an ONNX node stands for. Pure data, no onnx.

Op names: ONNX Runtime dumps name ops ``onnx::<OpType>`` for the default domain and
``<domain>::<OpType>`` otherwise (``com.microsoft::FusedMatMul``); the table keys ops by
:func:`onnx_key` (``Gemm``, ``com.microsoft::FusedMatMul``).

What the aligner does with it (:mod:`opscope.compare.crossframework`):

1. **Correspondence.** Within one module, both op sequences are aligned with
   :meth:`~OpTable.corresponds` as the match predicate (never by position alone).
2. **Decompositions.** Some opsets spell one torch op as several nodes (GELU as
   ``Div, Erf, Add, Mul, Mul`` before opset 20; LayerNorm as ``ReduceMean, Sub, Pow, ...``
   before opset 17): :data:`DECOMPOSITIONS`. The torch op's output pairs with the run's last
   node; the inner nodes have no counterpart (``Add`` inside a GELU is no residual ``add``).
3. **Folds.** :data:`FOLDED`: an eval-mode ``BatchNorm`` folded into the preceding ``Conv``
   (whose weight is then a derived initializer): the ONNX ``Conv`` output is the torch
   batch norm's output, and the torch convolution stays unpaired.
4. **Internal nodes.** :data:`NO_COUNTERPART` (``Constant``, ``Shape``, a converter's
   ``Cast``...) are bookkeeping: unpaired, judged as identities if they carry data.
5. **ORT fusions.** :data:`FUSED`: a fused node (``Gemm`` from MatMul+Add,
   ``com.microsoft::FusedMatMul``, ``SkipLayerNormalization``) pairs with the last torch op
   of the group it covers. ``FusedConv``/``FusedGemm`` with an ``activation`` attribute
   output the activation's result.
"""

from __future__ import annotations

from opscope.compare.crossframework.tables.table import OpTable

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

# ONNX Runtime's fused and contrib nodes (default-domain ones by type) -> the torch ops of the
# group they cover.
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
    "Gemm": ("aten.linear", "aten.addmm", "aten.matmul", "aten.add"),
    "LayerNormalization": ("aten.layer_norm", "aten.native_layer_norm"),
}.items()}

# Bookkeeping nodes with no torch counterpart by design: leave unpaired.
NO_COUNTERPART: frozenset[str] = frozenset({
    "Constant", "ConstantOfShape", "Shape", "Size", "Range", "Identity", "Cast", "CastLike",
    "com.microsoft.nchwc::ReorderInput", "com.microsoft.nchwc::ReorderOutput",
    "com.microsoft::MemcpyToHost", "com.microsoft::MemcpyFromHost",
})

# Nodes that keep every element in place: one on one side only is judged as an identity.
ORDER_PRESERVING: frozenset[str] = frozenset({
    "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Cast", "CastLike", "Dropout", "Expand",
})

# Nodes that only move or copy elements: many move tensors of one size, so position is no proof.
MOVEMENT: frozenset[str] = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Slice",
                                      "Split", "Gather", "Expand", "Identity", "Cast", "Concat", "Tile",
                                      "Pad", "Dropout"})


def split_onnx_op(op: str) -> tuple[str, str]:
    """``(domain, op_type)`` of an ``op`` column value; the default domain is ``""``."""
    domain, _, op_type = op.rpartition("::")
    return ("" if domain in ("onnx", "ai.onnx") else domain), op_type


def onnx_key(op: str) -> str:
    """The table key of an op: ``onnx::Gemm`` and ``Gemm`` -> ``Gemm``; other domains keep theirs."""
    domain, op_type = split_onnx_op(op) if "::" in op else ("", op)
    return op_type if domain == "" else f"{domain}::{op_type}"


ONNX = OpTable(
    framework="onnx", to_torch=ONNX_TO_TORCH, decompositions=DECOMPOSITIONS, fusions=FUSED, folded=FOLDED,
    internal=NO_COUNTERPART, order_preserving=ORDER_PRESERVING, movement=MOVEMENT,
    key=onnx_key, op_type=lambda op: split_onnx_op(op)[1], activation_attrs=("activation",),
    name="ONNX", runtime="ONNX Runtime",
)

__all__ = ["DECOMPOSITIONS", "FOLDED", "FUSED", "NO_COUNTERPART", "ONNX", "ONNX_TO_TORCH", "onnx_key", "split_onnx_op"]
