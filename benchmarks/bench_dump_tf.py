"""opscope.tensorflow.dump overhead on a small Keras transformer trained with fit.

Prints each case's median step time over a bare fit's, in the same invocation, runs
alternating, in wall time and in process CPU time (every thread; what a loaded machine
does not inflate), with each round's own ratio as the spread; then the tensor dump's write
speed next to the disk's own sequential write. Targets (issue 16): statistics at op level
<= 2x; steps not selected ~1.0x; tensor dump writing at >= 50% of the disk's speed.

    python benchmarks/bench_dump_tf.py [--steps 40] [--rounds 4] [--case op] [--host-stats]

``--case op``: the op-level statistics case only (A/Bs of two trees, one process each);
``--host-stats``: statistics measured by the host callback instead of the in-graph op.

Rounds of 12 steps spread by +-15% on a quiet 2-core machine (one round of the same code read
1.90x, the next 2.41x): the defaults pool ~150 steps per case, which resolves a few percent.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from statistics import median

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402


def transformer(d: int = 64, heads: int = 4, seq: int = 32, vocab: int = 500, layers: int = 2):
    import keras

    keras.utils.set_random_seed(0)
    inp = keras.Input((seq,), dtype="int32")
    x = keras.layers.Embedding(vocab, d, name="embed")(inp)
    for i in range(layers):
        a = keras.layers.MultiHeadAttention(heads, d // heads, name=f"attn{i}")(x, x)
        x = keras.layers.LayerNormalization(name=f"ln{i}a")(x + a)
        f = keras.layers.Dense(4 * d, activation="relu", name=f"ff{i}a")(x)
        f = keras.layers.Dense(d, name=f"ff{i}b")(f)
        x = keras.layers.LayerNormalization(name=f"ln{i}b")(x + f)
    model = keras.Model(inp, keras.layers.Dense(vocab, name="head")(x), name="tfm")
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def batches(n: int, batch: int = 16, seq: int = 32, vocab: int = 500) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(0).integers(0, vocab, (n * batch, seq)).astype("int32")
    return x, np.roll(x, -1, axis=1)


class StepTimes:
    """A Keras callback that keeps each batch's wall time and the process's CPU time in it
    (every thread: TensorFlow's, the host callback's, the dump writer's)."""

    def __new__(cls):  # built lazily so that importing this file does not import keras
        import keras

        class _Times(keras.callbacks.Callback):
            def __init__(self) -> None:
                super().__init__()
                self.times: list[float] = []
                self.cpu: list[float] = []

            def on_train_batch_begin(self, batch, logs=None) -> None:
                self._t, self._c = time.perf_counter(), time.process_time()

            def on_train_batch_end(self, batch, logs=None) -> None:
                self.times.append(time.perf_counter() - self._t)
                self.cpu.append(time.process_time() - self._c)
        return _Times()


def run(model, data, root: str, keys: dict | None) -> tuple[list[float], list[float]]:
    import opscope.tensorflow as otf

    times = StepTimes()
    callbacks = [times]
    if keys is not None:
        path = os.path.join(root, "dump")
        shutil.rmtree(path, ignore_errors=True)
        callbacks.insert(0, otf.DumpCallback(path, **keys))
    model.fit(*data, batch_size=16, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
    return times.times, times.cpu


def ratios(bare, case, rounds: int, warmup: int = 2) -> tuple[float, float, list[float], list[float]]:
    """Median step wall time and CPU time of ``case`` over ``bare``'s, all rounds pooled, and each
    round's own ratios (the spread). Runs alternate (bare first, then case first, ...)."""
    pooled: dict[str, list[list[float]]] = {"bare": [[], []], "case": [[], []]}
    walls, cpus = [], []
    for r in range(rounds):
        order = [("bare", bare), ("case", case)] if r % 2 == 0 else [("case", case), ("bare", bare)]
        got = {name: fn() for name, fn in order}
        for name, (wall, cpu) in got.items():
            pooled[name][0] += wall[warmup:]
            pooled[name][1] += cpu[warmup:]
        walls.append(median(got["case"][0][warmup:]) / median(got["bare"][0][warmup:]))
        cpus.append(median(got["case"][1][warmup:]) / median(got["bare"][1][warmup:]))
    wall = median(pooled["case"][0]) / median(pooled["bare"][0])
    return wall, median(pooled["case"][1]) / median(pooled["bare"][1]), walls, cpus


def disk_throughput(root: str, mb: int = 256) -> float:
    """The disk's own sequential write, MB/s (written and fsynced like a dump's shards)."""
    buf = np.random.default_rng(0).integers(0, 255, mb << 20, dtype=np.uint8)
    path = os.path.join(root, "disk-probe")
    start = time.perf_counter()
    with open(path, "wb") as f:
        f.write(buf.tobytes())
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - start
    os.remove(path)
    return mb / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=4, help="even: each case runs first as often as bare")
    parser.add_argument("--case", choices=["all", "op"], default="all", help="op: the op-level statistics case only")
    parser.add_argument("--host-stats", action="store_true", help="measure on the host, not by the in-graph op")
    args = parser.parse_args()
    import tensorflow as tf

    if args.host_stats:
        from opscope.capture.tensorflow import opbuild

        opbuild.ENABLED = False

    model, data = transformer(), batches(args.steps)
    model.fit(*data, batch_size=16, epochs=1, verbose=0)  # trace the bare step once
    cases = [("statistics, op level (target <= 2x)", {"level": "op"}),
             ("statistics, layer level", {"level": "layer"}),
             ("steps not selected (target ~1.0x)", {"level": "op", "steps": [10_000]}),
             ("full tensors, op level", {"level": "op", "data": "tensor"})][:1 if args.case == "op" else None]
    print(f"tensorflow {tf.__version__}, Keras transformer d=64 seq=32 batch=16; "
          f"{args.steps} steps x {args.rounds} rounds, order alternating; load average {os.getloadavg()[0]:.1f}")
    print(f"{'case':38s} {'wall':>6s} {'(each round)':>18s} {'CPU':>7s} {'(each round)':>18s}")
    with tempfile.TemporaryDirectory(dir=os.environ.get("OPSCOPE_BENCH_DIR")) as root:
        for name, keys in cases:
            wall, cpu, walls, cpus = ratios(lambda: run(model, data, root, None),
                                            lambda k=keys: run(model, data, root, k), args.rounds)
            print(f"{name:38s} {wall:5.2f}x {_spread(walls):>18s} {cpu:6.2f}x {_spread(cpus):>18s}")
        if args.case == "all":
            _tensor_speed(model, data, root)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


def _spread(values: list[float]) -> str:
    return f"({min(values):.2f}-{max(values):.2f}x)"


def _tensor_speed(model, data, root: str) -> None:
    import opscope.tensorflow as otf

    path = os.path.join(root, "dump")
    shutil.rmtree(path, ignore_errors=True)
    cb = otf.DumpCallback(path, level="op", data="tensor")
    model.fit(*data, batch_size=16, epochs=1, verbose=0, shuffle=False, callbacks=[cb])
    writer = cb.session.writer
    mb = writer.tensor_bytes / 1e6
    speed = mb / max(writer.write_seconds, 1e-9)
    disk = disk_throughput(root)
    print(f"tensor dump wrote {mb:.0f} MB in {writer.write_seconds:.1f} s of writer time = {speed:.0f} MB/s; "
          f"the disk's own sequential write: {disk:.0f} MB/s ({speed / disk:.0%})")


if __name__ == "__main__":
    main()
