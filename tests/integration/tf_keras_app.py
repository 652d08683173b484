"""Train Keras' own MobileNetV2 (keras.applications, random weights: no download) for two
steps of fit, dumped or not, for the TF tests on a model nobody here wrote.

    python tf_keras_app.py DUMP|- [--policy mixed_bfloat16] [--fault LAYER] [--weights FILE]
    python tf_keras_app.py --runs RUNS.json   (a list of such argument lists, one after another)

``--fault LAYER`` scales that layer's output by 1.05; ``--weights FILE`` writes there the
SHA-1 of every weight's bytes after training. ``--runs``: several runs in one process, each
from a cleared Keras session and the float32 policy (TensorFlow's import is ~6 s).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dump")
    p.add_argument("--policy", default=None)
    p.add_argument("--fault", default=None)
    p.add_argument("--weights", default=None)
    args = p.parse_args(argv)
    import keras
    import numpy as np

    import opscope.tensorflow as otf

    keras.utils.set_random_seed(0)
    if args.policy:
        keras.mixed_precision.set_global_policy(args.policy)
    model = keras.applications.MobileNetV2(weights=None, input_shape=(32, 32, 3), classes=10, alpha=0.35)
    if args.fault:
        layer = model.get_layer(args.fault)
        call = layer.call
        layer.call = lambda *a, **k: call(*a, **k) * 1.05
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss=keras.losses.SparseCategoricalCrossentropy())
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((16, 32, 32, 3)).astype("float32"), rng.integers(0, 10, 16)
    callbacks = [] if args.dump == "-" else [otf.DumpCallback(args.dump, steps="0|1", overwrite=True)]
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
    if args.weights:
        digest = hashlib.sha1(b"".join(w.numpy().tobytes() for w in model.weights)).hexdigest()
        with open(args.weights, "w") as f:
            f.write(digest)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # keras_runs.py, beside (runpy.run_path too)
    from keras_runs import main_or_many

    main_or_many(main)
