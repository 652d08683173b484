"""Keras layers (a TensorFlow dump at ``level="layer"``, manifest level ``tf-layer``) against
the torch module classes of a PyTorch port (a dump at ``level="module"``).

A Keras layer may apply an activation to its output (``Dense(16, activation="relu")``)
where the port has a module of its own (``Linear`` then ``ReLU``):
:data:`ACTIVATION_MODULES` names the torch modules for each Keras activation.
Parameters are named differently too (``kernel`` / ``weight``): :data:`PARAM_NAMES`.
"""

from __future__ import annotations

from opscope.compare.crossframework.tables.table import OpTable

# Keras activation name (Layer.activation.__name__) -> torch modules that compute it
ACTIVATION_MODULES: dict[str, frozenset[str]] = {k: frozenset(v) for k, v in {
    "relu": ("ReLU",), "relu6": ("ReLU6",), "gelu": ("GELU",), "tanh": ("Tanh",), "sigmoid": ("Sigmoid",),
    "silu": ("SiLU",), "swish": ("SiLU",), "softmax": ("Softmax",), "log_softmax": ("LogSoftmax",),
    "elu": ("ELU",), "selu": ("SELU",), "leaky_relu": ("LeakyReLU",), "softplus": ("Softplus",),
    "softsign": ("Softsign",), "hard_sigmoid": ("Hardsigmoid",), "hard_silu": ("Hardswish",),
    "hard_swish": ("Hardswish",), "mish": ("Mish",), "exponential": (), "linear": ("Identity",),
}.items()}
ACTIVATIONS: frozenset[str] = frozenset().union(*ACTIVATION_MODULES.values())

_CONTAINERS = ("Sequential", "Functional", "Model", "ModuleList", "ModuleDict")

LAYER_TO_TORCH: dict[str, frozenset[str]] = {k: frozenset(v) for k, v in {
    "Dense": ("Linear", "LazyLinear", "NonDynamicallyQuantizableLinear"),
    "EinsumDense": ("Linear", "NonDynamicallyQuantizableLinear"),
    "Conv1D": ("Conv1d",), "Conv2D": ("Conv2d",), "Conv3D": ("Conv3d",), "DepthwiseConv2D": ("Conv2d",),
    "Conv1DTranspose": ("ConvTranspose1d",), "Conv2DTranspose": ("ConvTranspose2d",),
    "Conv3DTranspose": ("ConvTranspose3d",),
    "Embedding": ("Embedding",), "LayerNormalization": ("LayerNorm",), "RMSNormalization": ("RMSNorm",),
    "BatchNormalization": ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm"),
    "GroupNormalization": ("GroupNorm",),
    "Dropout": ("Dropout", "Dropout1d", "Dropout2d", "Dropout3d"), "SpatialDropout2D": ("Dropout2d",),
    "Flatten": ("Flatten",), "Identity": ("Identity",),
    "MaxPooling1D": ("MaxPool1d",), "MaxPooling2D": ("MaxPool2d",), "MaxPooling3D": ("MaxPool3d",),
    "AveragePooling1D": ("AvgPool1d",), "AveragePooling2D": ("AvgPool2d",), "AveragePooling3D": ("AvgPool3d",),
    "GlobalAveragePooling1D": ("AdaptiveAvgPool1d",), "GlobalAveragePooling2D": ("AdaptiveAvgPool2d",),
    "GlobalMaxPooling1D": ("AdaptiveMaxPool1d",), "GlobalMaxPooling2D": ("AdaptiveMaxPool2d",),
    "ZeroPadding2D": ("ZeroPad2d",), "UpSampling2D": ("Upsample", "UpsamplingNearest2d"),
    "ReLU": ("ReLU", "ReLU6"), "LeakyReLU": ("LeakyReLU",), "ELU": ("ELU",), "PReLU": ("PReLU",),
    "Softmax": ("Softmax",), "Activation": tuple(ACTIVATIONS),
    "MultiHeadAttention": ("MultiheadAttention",), "LSTM": ("LSTM",), "GRU": ("GRU",),
    **{c: _CONTAINERS for c in _CONTAINERS},
}.items()}

# Layers whose tensors are laid out channels-last by default (``data_format``): their torch
# counterparts hold channels-first ones.
SPATIAL: frozenset[str] = frozenset({
    "Conv1D", "Conv2D", "Conv3D", "DepthwiseConv2D", "SeparableConv2D", "Conv1DTranspose", "Conv2DTranspose",
    "Conv3DTranspose", "MaxPooling1D", "MaxPooling2D", "MaxPooling3D", "AveragePooling1D", "AveragePooling2D",
    "AveragePooling3D", "ZeroPadding2D", "UpSampling2D", "Cropping2D", "SpatialDropout2D",
})

# A Keras variable's own name -> the torch parameter (or buffer) name of the same tensor
PARAM_NAMES: dict[str, str] = {"kernel": "weight", "bias": "bias", "gamma": "weight", "beta": "bias",
                               "embeddings": "weight", "moving_mean": "running_mean",
                               "moving_variance": "running_var", "scale": "weight"}

KERAS = OpTable(
    framework="tf-layer", to_torch=LAYER_TO_TORCH, decompositions={}, fusions={}, folded={},
    internal=frozenset(), order_preserving=frozenset({"Flatten", "Reshape", "Dropout", "Identity"}),
    movement=frozenset({"Flatten", "Reshape", "Permute", "Identity"}), key=lambda op: op, op_type=lambda op: op,
    activation_attrs=("activation",), name="Keras", runtime="TensorFlow", layers=True,
)

__all__ = ["ACTIVATIONS", "ACTIVATION_MODULES", "KERAS", "LAYER_TO_TORCH", "PARAM_NAMES", "SPATIAL"]
