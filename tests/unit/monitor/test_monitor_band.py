"""The detector's native step (``monitor/_c/band.c``) against its numpy path: the same state
after every step and the same events, on streams with every kind of series and trouble."""

from __future__ import annotations

import numpy as np
import pytest

from opscope.monitor.detect import BandDetector
from opscope.monitor.registry import SeriesTable

pytestmark = pytest.mark.skipif(not BandDetector.native, reason="the monitor's native module is not built")

KINDS = ("grad", "exp_avg", "exp_avg_sq", "activation", "activation_grad", "weight", "input")
STATE = ("flags", "logs", "base", "lin_ids", "lins", "count", "quiet_until", "med", "mad")


def streams(seed: int, steps: int, n: int) -> list[tuple[list[tuple[str, str]], np.ndarray, np.ndarray]]:
    """Steps of ``n`` norms (log-normal noise around a scale of their own, jumps and falls of
    1e3, runs of zeros, NaN/Inf and non-finite counts, series that appear late or skip steps)
    and a loss and a learning rate (warm-up from 0, spikes): (keys, values, bad) per step."""
    rng = np.random.default_rng(seed)
    keys = [(KINDS[k % len(KINDS)], f"layer{k}") for k in range(n)] + [("loss", "loss"), ("lr", "lr")]
    scale = 10.0 ** rng.uniform(-12, 3, n)
    born = np.where(rng.random(n) < 0.2, rng.integers(0, steps // 2, n), 0)
    out = []
    for s in range(steps):
        norms = scale * np.exp(rng.normal(0, 0.3, n)) * 10.0 ** (3 * (rng.random(n) < 0.01))
        norms /= 10.0 ** (3 * (rng.random(n) < 0.01))
        norms[(rng.random(n) < 0.02) | ((np.arange(n) % 11 == 0) & (s < 40))] = 0.0
        norms[rng.random(n) < 0.003] = rng.choice([np.nan, np.inf])
        bad = (rng.random(n + 2) < 0.003).astype(np.float64) * 3
        loss = 3.0 - s / steps + rng.normal(0, 0.01) + (2.0 if rng.random() < 0.02 else 0.0)
        lr = 1e-3 * min(1.0, s / 20) * (30.0 if rng.random() < 0.01 else 1.0)
        values = np.concatenate([norms, [loss, lr]])
        present = np.flatnonzero((np.concatenate([born, [0, 0]]) <= s) & (rng.random(n + 2) > 0.05))
        out.append(([keys[i] for i in present], values[present], bad[present]))
    return out


def replay(native: bool, window: int, threshold: float, warmup: int, steps: list, move: float = 2.0):
    det = BandDetector(window, threshold, warmup, SeriesTable(), move_decades=move)
    det.native = native
    for step, (keys, values, bad) in enumerate(steps):
        ids = np.array([det.series.id(*k) for k in keys], dtype=np.int64)
        event = det.update(step, 0, ids, values, bad)
        yield step, det, event


@pytest.mark.parametrize(("window", "threshold", "warmup", "move", "seed"),
                         [(32, 8.0, 8, 2.0, 0), (16, 3.0, 6, 0.5, 1), (30, 4.0, 5, 1.0, 2), (5, 2.0, 2, 0.2, 3)])
def test_the_native_step_keeps_the_numpy_paths_state_and_events(window, threshold, warmup, move, seed):
    steps = streams(seed, 300, 60)
    events = 0
    for (step, a, ea), (_, b, eb) in zip(replay(True, window, threshold, warmup, steps, move),
                                         replay(False, window, threshold, warmup, steps, move), strict=True):
        for name in STATE:
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=f"{name} at step {step}")
        assert repr(ea) == repr(eb), f"step {step}"
        events += ea is not None
    assert events >= 10  # departures of every rule were taken (not a stream too quiet to compare)


def test_ids_repeated_in_a_step_are_judged_as_numpy_does():
    # a model called twice in a step (gradient accumulation) hands its input twice
    results = []
    for native in (True, False):
        det = BandDetector(16, 8.0, 6, SeriesTable())
        det.native = native
        i = det.series.id("input", "arg0")
        events = [det.update(s, 0, np.array([i, i]), np.array([1.0, 1e4 if s == 20 else 2.0]), np.zeros(2))
                  for s in range(30)]
        results.append(([repr(e) for e in events], det.logs.tolist(), det.count.tolist()))
    assert results[0] == results[1]
    assert [e for e in results[0][0] if e != "None"]  # the 1e4x jump at step 20 fired
