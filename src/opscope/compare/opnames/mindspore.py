"""MindSpore op types (as its Data Dump names kernels) -> the torch op each behaves as.

Only what compare's per-op rules need: layout and cast ops (read through, judged as
identities when one side has them only), reductions and normalizations (conditioning), the
element-wise product rule, and the common math so that reports read alike. Pure data.
"""

from __future__ import annotations

VOCABULARY: dict[str, str] = {
    # linear algebra
    "MatMul": "mm", "BatchMatMul": "bmm", "MatMulExt": "matmul", "BatchMatMulExt": "bmm",
    "Dense": "linear", "Conv2D": "convolution", "Conv3D": "convolution",
    # element-wise
    "Add": "add", "AddN": "add", "BiasAdd": "add", "AddExt": "add", "Sub": "sub", "SubExt": "sub",
    "Mul": "mul", "Muls": "mul", "RealDiv": "div", "Div": "div", "Neg": "neg", "Abs": "abs",
    "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Rsqrt": "rsqrt", "Pow": "pow", "Square": "square",
    "Erf": "erf", "Maximum": "maximum", "Minimum": "minimum", "Reciprocal": "reciprocal",
    # activations
    "GeLU": "gelu", "FastGeLU": "gelu", "ReLU": "relu", "ReLU6": "hardtanh", "Sigmoid": "sigmoid",
    "Tanh": "tanh", "SiLU": "silu", "Softmax": "_softmax", "LogSoftmax": "_log_softmax",
    # normalization
    "LayerNorm": "native_layer_norm", "LayerNormV3": "native_layer_norm", "BatchNorm": "native_batch_norm",
    "RmsNorm": "rms_norm", "GroupNorm": "native_group_norm",
    # reductions (a bias gradient sums over the batch)
    "ReduceSum": "sum", "ReduceMean": "mean", "SumExt": "sum", "MeanExt": "mean", "BiasAddGrad": "sum",
    # values kept, order kept
    "Reshape": "reshape", "ExpandDims": "unsqueeze", "Squeeze": "squeeze", "Flatten": "flatten",
    "Identity": "alias", "TensorMove": "clone", "Contiguous": "contiguous",
    # values kept, moved
    "Transpose": "transpose", "TransposeExt": "transpose", "BroadcastTo": "expand",
    "StridedSlice": "slice", "Slice": "slice",
    # values rounded to another dtype
    "Cast": "_to_copy",
    # gradients
    "GeLUGrad": "gelu_backward", "SoftmaxGrad": "_softmax_backward_data",
    "LayerNormGrad": "native_layer_norm_backward", "ReluGrad": "threshold_backward",
    "SigmoidGrad": "sigmoid_backward", "TanhGrad": "tanh_backward",
}
