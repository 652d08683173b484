"""Overhead of opscope.tensorflow.profile against a bare Keras ``fit``, in one invocation.

A small Keras transformer (2 blocks, d=64, 4 heads, seq 32, batch 16, AdamW) on a tf.data
pipeline, TensorFlow set to one inter-op and one intra-op thread (``tf.config.threading``).
Two measurements of the training trace, both against a bare run in the same process:

1. ``fit`` rounds: two identical models, one bare, one with the profile as its callback
   (one session over every round, so its train function is traced once), one epoch each,
   alternating (which model goes first alternates too); each round's first steps
   (tracing) left out. Wall and process CPU time between batch starts, from a timing
   callback both carry (batch-begin only, so Keras keeps its asynchronous batch-end
   dispatch). Rounds of a few hundred ms: load that changes between rounds on a shared
   machine shows up here.
2. step by step: two identical models, one train function traced without and one with
   the marks, called alternately (what ``fit`` runs per batch), the profile's own per-step work
   (reading the marks, the step row) timed with the marked call. Load hits both alike.

Then one ``fit`` with the task trace on steps 10-14 and its cost as opscope reports it.

    python benchmarks/bench_profile_tf.py [--rounds 12] [--steps 30] [--verbose]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from opscope.tensorflow import profile  # noqa: E402

SKIP = 3  # steps at the start of each round: tracing, first allocations


def transformer(seq: int = 32, d: int = 64, heads: int = 4, vocab: int = 500) -> keras.Model:
    inp = keras.Input((seq,), dtype="int32")
    x = keras.layers.Embedding(vocab, d)(inp)
    for i in range(2):
        a = keras.layers.MultiHeadAttention(heads, d // heads, name=f"attn{i}")(x, x)
        x = keras.layers.LayerNormalization(name=f"ln{i}a")(x + a)
        f = keras.layers.Dense(4 * d, activation="relu", name=f"ff{i}a")(x)
        x = keras.layers.LayerNormalization(name=f"ln{i}b")(x + keras.layers.Dense(d, name=f"ff{i}b")(f))
    out = keras.layers.Dense(10, name="head")(keras.layers.GlobalAveragePooling1D()(x))
    model = keras.Model(inp, out)
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-3), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return model


def dataset(steps: int, seq: int = 32, vocab: int = 500, batch: int = 16) -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    x = rng.integers(0, vocab, (steps * batch, seq)).astype("int32")
    y = rng.integers(0, 10, (steps * batch,)).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)


class BatchClock(keras.callbacks.Callback):
    """Wall and process CPU time between consecutive batch starts (batch-begin only: Keras
    keeps its asynchronous batch-end dispatch, as in a bare fit)."""

    def __init__(self) -> None:
        super().__init__()
        self.marks: list[tuple[float, float]] = []

    def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
        self.marks.append((time.perf_counter(), time.process_time()))

    def on_train_end(self, logs: object = None) -> None:
        self.marks.append((time.perf_counter(), time.process_time()))

    def steps(self) -> tuple[list[float], list[float]]:
        pairs = list(zip(self.marks, self.marks[1:]))[SKIP:]
        return [b[0] - a[0] for a, b in pairs], [b[1] - a[1] for a, b in pairs]


def fit_round(
    model: keras.Model, data: tf.data.Dataset, extra: list[keras.callbacks.Callback]
) -> tuple[list[float], list[float]]:
    clock = BatchClock()
    model.fit(data, epochs=1, verbose=0, callbacks=[*extra, clock])
    return clock.steps()


def interleaved(
    bare_model: keras.Model, model: keras.Model, data: tf.data.Dataset, out: Path, steps: int
) -> dict[str, list[float]]:
    """Wall time of single train-function calls of two identical models, one traced bare and
    one traced with the marks, called alternately (what ``fit`` runs per batch, without its
    callbacks): load that drifts hits both sides alike. Two models, not two functions of one
    model: with one model the bare function ran as slowly as the marked one (17.3 against
    17.1 ms a step, where two models gave 13.7 against 14.7), which hid the marks' cost."""
    bare_model.make_train_function(force=True)
    bare_fn = bare_model.train_function
    bare_it, marked_it = iter(data.repeat()), iter(data.repeat())
    bare_fn(bare_it)
    times: dict[str, list[float]] = {"bare": [], "profiled": [], "bare_cpu": [], "profiled_cpu": []}
    with profile(str(out), overwrite=True) as session:
        model.make_train_function(force=True)  # traced under the session: holds the marks
        marked_fn = model.train_function
        marked_fn(marked_it)
        session.step()
        for _ in range(steps):
            t0, c0 = time.perf_counter(), time.process_time()
            bare_fn(bare_it)
            t1, c1 = time.perf_counter(), time.process_time()
            marked_fn(marked_it)
            session.step()
            t2, c2 = time.perf_counter(), time.process_time()
            times["bare"].append(t1 - t0)
            times["profiled"].append(t2 - t1)
            times["bare_cpu"].append(c1 - c0)
            times["profiled_cpu"].append(c2 - c1)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--verbose", action="store_true", help="print each round's medians")
    args = parser.parse_args()
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}; tf.config.threading: inter-op 1, intra-op 1")
    keras.utils.set_random_seed(0)
    bare_model, profiled_model, data = transformer(), transformer(), dataset(args.steps)
    bare_model.fit(data.take(SKIP + 1), epochs=1, verbose=0)  # trace the bare model's function once
    wall: dict[str, list[float]] = {"bare": [], "profiled": []}
    cpu: dict[str, list[float]] = {"bare": [], "profiled": []}
    with tempfile.TemporaryDirectory() as tmp:
        with profile(str(Path(tmp) / "train"), overwrite=True) as session:  # one session: traced once
            for r in range(args.rounds):
                order = [("bare", bare_model, []), ("profiled", profiled_model, [session])]
                for name, model, extra in order[:: 1 if r % 2 == 0 else -1]:  # which runs first alternates
                    w, c = fit_round(model, data, extra)
                    wall[name] += w
                    cpu[name] += c
                    if args.verbose:
                        mw, mc = statistics.median(w) * 1e3, statistics.median(c) * 1e3
                        print(f"  round {r} {name}: {mw:.3f} ms wall, {mc:.3f} ms CPU")
        med = {k: statistics.median(v) for k, v in wall.items()}
        cmed = {k: statistics.median(v) for k, v in cpu.items()}
        print(f"training trace, Keras fit ({len(wall['bare'])} steps each, {args.rounds} rounds interleaved):")
        for label, m in (("wall", med), ("process CPU", cmed)):
            b, p = m["bare"] * 1e3, m["profiled"] * 1e3
            print(f"  {label}: bare {b:.3f} ms/step, profiled {p:.3f} ms/step, ratio {p / b:.3f}x")
        load = os.getloadavg()[0]
        print(f"  load average {load:.2f} on {os.cpu_count()} CPUs (wall ratios are only as good as a quiet machine)")
        pair = interleaved(bare_model, profiled_model, data, Path(tmp) / "pairs", args.rounds * args.steps)
        print(
            f"training trace, step by step ({len(pair['bare'])} pairs; two models, one train function traced "
            "without and one with the marks, called alternately, the profile's per-step work included):"
        )
        b, p = statistics.median(pair["bare"]), statistics.median(pair["profiled"])
        ratios = sorted(q / a for a, q in zip(pair["bare"], pair["profiled"]))
        print(
            f"  wall: bare {b * 1e3:.3f} ms/step, profiled {p * 1e3:.3f} ms/step, ratio of medians {p / b:.3f}x, "
            f"median of pair ratios {ratios[len(ratios) // 2]:.3f}x"
        )
        bc, pc = statistics.median(pair["bare_cpu"]), statistics.median(pair["profiled_cpu"])
        print(f"  process CPU: bare {bc * 1e3:.3f} ms/step, profiled {pc * 1e3:.3f} ms/step, ratio {pc / bc:.3f}x")
        task_session = profile(str(Path(tmp) / "task"), overwrite=True, task_trace=True, steps="10-14")
        profiled_model.fit(data, epochs=1, verbose=0, callbacks=[task_session])
        task = task_session.result.summary["task_trace"]
        print(
            f"task trace (steps 10-14): profiled step / unprofiled step {task.get('ratio')}x, "
            f"{task['trace_mb_per_step']} MB of trace per step, {task['export_ms_per_step']} ms export per step "
            "(between steps, not in step times)"
        )


if __name__ == "__main__":
    main()
