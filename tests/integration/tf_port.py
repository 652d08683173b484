"""A small Keras convnet and its PyTorch port, trained two steps each under opscope (for
test_tf_port.py): writes ROOT/keras (level layer) and ROOT/<port> (level module) for each
port given, with full tensors.

    python tf_port.py ROOT [right] [activation] [transpose]

``right``: the weights copied with the layouts converted (Dense kernel (in, out) -> Linear
weight (out, in); Conv2D kernel (kh, kw, in, out) -> Conv2d weight (out, in, kh, kw); the
first Dense's rows reordered from Keras' H, W, C flatten order to torch's C, H, W) and the
input fed NCHW. ``activation``: the port applies Tanh where Keras' dense_1 applies relu.
``transpose``: the square dense_2's kernel copied without the transpose.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np  # noqa: E402

BATCH, STEPS = 8, 2


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((BATCH * STEPS, 8, 8, 3)).astype("float32"), \
        rng.standard_normal((BATCH * STEPS, 4)).astype("float32")


def keras_side(path: str) -> list[np.ndarray]:
    import keras

    import opscope.tensorflow as otf

    keras.utils.set_random_seed(0)
    layers = keras.layers
    model = keras.Sequential([keras.Input((8, 8, 3)), layers.Conv2D(4, 3, activation="relu", name="conv2d"),
                              layers.Flatten(name="flatten"), layers.Dense(16, activation="relu", name="dense_1"),
                              layers.Dense(16, name="dense_2"), layers.Dense(4, name="dense_3")], name="net")
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    weights = [w.numpy() for w in model.weights]
    x, y = data()
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False,
              callbacks=[otf.DumpCallback(path, level="layer", data="tensor", steps="all", overwrite=True)])
    return weights


def torch_side(path: str, weights: list[np.ndarray], fault: str) -> None:
    import torch

    import opscope

    nn = torch.nn
    m = nn.Sequential()
    m.conv, m.act0, m.flat = nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten()
    m.fc1, m.act1 = nn.Linear(144, 16), (nn.Tanh() if fault == "activation" else nn.ReLU())
    m.fc2, m.head = nn.Linear(16, 16), nn.Linear(16, 4)
    k_conv, b_conv, k1, b1, k2, b2, k3, b3 = weights
    k1 = k1.reshape(6, 6, 4, 16).transpose(2, 0, 1, 3).reshape(144, 16)  # H, W, C rows -> C, H, W
    with torch.no_grad():
        m.conv.weight.copy_(torch.tensor(k_conv.transpose(3, 2, 0, 1)))
        for layer, kernel, bias in ((m.conv, None, b_conv), (m.fc1, k1, b1), (m.fc2, k2, b2), (m.head, k3, b3)):
            if kernel is not None:
                layer.weight.copy_(torch.tensor(kernel if fault == "transpose" and layer is m.fc2 else kernel.T))
            layer.bias.copy_(torch.tensor(bias))
    x, y = data()
    xt, yt = torch.tensor(x.transpose(0, 3, 1, 2).copy()), torch.tensor(y)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with opscope.dump(path, level="module", data="tensor", overwrite=True) as d:
        for i in range(0, BATCH * STEPS, BATCH):
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(xt[i:i + BATCH]), yt[i:i + BATCH]).backward()
            opt.step()
            d.step()


def main() -> None:
    root = sys.argv[1]
    weights = keras_side(os.path.join(root, "keras"))
    for fault in sys.argv[2:]:
        torch_side(os.path.join(root, fault), weights, fault)


if __name__ == "__main__":
    main()
