"""Train a tiny Keras transformer for a few steps under opscope.tensorflow.dump (for the TF tests).

    python tf_train.py DUMP [--loop fit|custom|eager] [--policy mixed_bfloat16] [--fault ff0a]
                      [--level op|layer] [--steps 0|1] [--data statistics|tensor] [--jit] [--nan]
                      [--weights FILE]
    python tf_train.py --runs RUNS.json   (a list of such argument lists, trained one after another)

``--fault LAYER`` scales that Dense layer's output by 1.05 (a one-layer fault); ``--nan``
puts a NaN in ``ff0b``'s output at step 1. Without DUMP ("-") it trains with no dump (fit:
as ``opscope run`` / ``$OPSCOPE_CONFIG`` decide). ``--weights FILE`` writes there the SHA-1
of every weight's bytes after training (the tests compare dumped and bare runs bit for bit).
``--runs``: several runs in one process, each from a cleared Keras session and the float32
policy (TensorFlow's import, ~6 s, was most of a run's time).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # the same kernels run to run


def build(args: argparse.Namespace):
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    if args.policy:
        keras.mixed_precision.set_global_policy(args.policy)

    class Faulty(keras.layers.Dense):
        """A Dense layer whose output is off by 5% (the injected fault)."""

        def call(self, inputs):
            return super().call(inputs) * 1.05

    class Poisoned(keras.layers.Dense):
        def call(self, inputs):
            out = super().call(inputs)
            step = tf.cast(self.counter, out.dtype)
            self.counter.assign_add(1)
            return out + tf.where(step >= 1.0, tf.constant(float("nan"), out.dtype), tf.constant(0.0, out.dtype))

        def build(self, shape):
            super().build(shape)
            self.counter = self.add_weight(shape=(), initializer="zeros", trainable=False, name="counter")

    def dense(units, name, **kw):
        cls = Faulty if args.fault == name else Poisoned if args.nan and name == "ff0b" else keras.layers.Dense
        return cls(units, name=name, **kw)

    d, seq, vocab = 32, 16, 100
    inp = keras.Input((seq,), dtype="int32")
    x = keras.layers.Embedding(vocab, d, name="embed")(inp)
    a = keras.layers.MultiHeadAttention(2, d // 2, name="attn0")(x, x)
    x = keras.layers.LayerNormalization(name="ln0a")(x + a)
    f = dense(2 * d, "ff0a", activation="relu")(x)
    f = dense(d, "ff0b")(f)
    x = keras.layers.LayerNormalization(name="ln0b")(x + f)
    out = keras.layers.Dense(vocab, name="head", dtype="float32")(x)
    model = keras.Model(inp, out, name="tiny")
    model.compile(optimizer=keras.optimizers.Adam(1e-3), jit_compile=args.jit,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def data(n: int = 64):
    import numpy as np

    x = np.random.default_rng(0).integers(0, 100, (n, 16)).astype("int32")
    return x, np.roll(x, -1, axis=1)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dump")
    p.add_argument("--loop", default="fit", choices=["fit", "custom", "eager"])
    p.add_argument("--policy", default=None)
    p.add_argument("--fault", default=None)
    p.add_argument("--level", default="op")
    p.add_argument("--steps", default="0|1")
    p.add_argument("--data", default="statistics")
    p.add_argument("--jit", action="store_true")
    p.add_argument("--nan", action="store_true")
    p.add_argument("--spe", type=int, default=1, help="steps_per_execution")
    p.add_argument("--weights", default=None, help="write the SHA-1 of the trained weights here")
    args = p.parse_args(argv)
    model = build(args)
    train(model, args)
    if args.weights:
        digest = hashlib.sha1(b"".join(w.numpy().tobytes() for w in model.weights)).hexdigest()
        with open(args.weights, "w") as f:
            f.write(digest)


def train(model, args) -> None:
    x, y = data()
    if args.dump == "-" and args.loop == "fit":  # zero-code: OPSCOPE_CONFIG / opscope run decide
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
        return
    if args.dump == "-":
        custom_loop(model, x, y, args, None)
        return
    import opscope.tensorflow as otf

    keys = {"steps": args.steps, "level": args.level, "data": args.data, "overwrite": True}
    if args.loop == "fit":
        if args.spe > 1:
            model.compile(optimizer=model.optimizer, loss=model.loss, steps_per_execution=args.spe)
        cb = otf.DumpCallback(args.dump, **keys)
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False, callbacks=[cb])
        return
    custom_loop(model, x, y, args, otf.dump(args.dump, model=model, **keys))


def custom_loop(model, x, y, args, session) -> None:
    import tensorflow as tf

    loss_fn, opt = model.loss, model.optimizer

    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)
        return loss

    step = train_step if args.loop == "eager" else tf.function(train_step, jit_compile=args.jit)
    with session if session is not None else contextlib.nullcontext() as d:
        for i in range(0, len(x), 16):
            step(tf.constant(x[i:i + 16]), tf.constant(y[i:i + 16]))
            if d is not None:
                d.step()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # keras_runs.py, beside (runpy.run_path too)
    from keras_runs import main_or_many

    main_or_many(main)
