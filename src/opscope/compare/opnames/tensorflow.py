"""TensorFlow op types (``tf.<OpType>`` in opscope's TensorFlow dumps) -> the torch op each
behaves as, so compare's per-op rules (pass-through, conditioning of reductions and
normalizations, the element-wise product) apply to them. Pure data.
"""

from __future__ import annotations

VOCABULARY: dict[str, str] = {
    # linear algebra
    "MatMul": "mm", "BatchMatMulV2": "bmm", "BatchMatMulV3": "bmm", "BatchMatMul": "bmm", "Einsum": "einsum",
    "_FusedMatMul": "addmm", "Conv2D": "convolution", "Conv3D": "convolution", "DepthwiseConv2dNative": "convolution",
    # element-wise
    "AddV2": "add", "Add": "add", "AddN": "add", "BiasAdd": "add", "Sub": "sub", "Mul": "mul",
    "RealDiv": "div", "Div": "div", "DivNoNan": "div", "Neg": "neg", "Abs": "abs", "Exp": "exp", "Log": "log",
    "Sqrt": "sqrt", "Rsqrt": "rsqrt", "Pow": "pow", "Square": "square", "SquaredDifference": "sub",
    "Erf": "erf", "Maximum": "maximum", "Minimum": "minimum", "Reciprocal": "reciprocal",
    # activations
    "Relu": "relu", "Relu6": "hardtanh", "Gelu": "gelu", "Sigmoid": "sigmoid", "Tanh": "tanh",
    "Softmax": "_softmax", "LogSoftmax": "_log_softmax", "Selu": "selu", "Elu": "elu",
    # normalization
    "FusedBatchNormV3": "native_batch_norm",
    # reductions (a bias gradient sums over the batch)
    "Sum": "sum", "Mean": "mean", "BiasAddGrad": "sum", "Prod": "prod", "Max": "amax", "Min": "amin",
    # values kept, order kept
    "Reshape": "reshape", "ExpandDims": "unsqueeze", "Squeeze": "squeeze", "Identity": "alias",
    "StopGradient": "detach", "Snapshot": "clone", "EnsureShape": "alias",
    # values kept, moved
    "Transpose": "transpose", "BroadcastTo": "expand", "Tile": "repeat", "StridedSlice": "slice",
    "Slice": "slice", "GatherV2": "index_select", "ConcatV2": "cat", "Pack": "stack",
    # values rounded to another dtype
    "Cast": "_to_copy",
    # gradients
    "ReluGrad": "threshold_backward", "SigmoidGrad": "sigmoid_backward", "TanhGrad": "tanh_backward",
    "SoftmaxCrossEntropyWithLogits": "cross_entropy", "SparseSoftmaxCrossEntropyWithLogits": "cross_entropy",
}
