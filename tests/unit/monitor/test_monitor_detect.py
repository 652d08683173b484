"""The band detector on series built here: what fires, when, and what does not."""

from __future__ import annotations

import math

import numpy as np
import pytest

from opscope.monitor.detect import BandDetector
from opscope.monitor.registry import SeriesTable

KEY_A, KEY_B, LOSS = ("grad", "a.weight"), ("grad", "b.weight"), ("loss", "loss")
POSITION = {KEY_A: 1, KEY_B: 0}  # b's gradient is made first in the step


def detector(window: int = 16, threshold: float = 8.0, warmup: int = 6) -> BandDetector:
    return BandDetector(window, threshold, warmup, SeriesTable())


def update(det: BandDetector, step: int, values: dict):
    ids = np.array([det.series.id(*k, POSITION.get(k)) for k in values])
    return det.update(step, 0, ids, np.array(list(values.values())), np.zeros(len(ids)))


def run(series: dict, steps: int, window: int = 16, threshold: float = 8.0, warmup: int = 6):
    det = detector(window, threshold, warmup)
    events = []
    for step in range(steps):
        event = update(det, step, {k: f(step) for k, f in series.items()})
        if event is not None:
            events.append(event)
    return events


def noisy(scale: float, seed: int):
    rng = np.random.default_rng(seed)
    noise = rng.normal(0, 0.1, 200)
    return lambda s: scale * math.exp(noise[s])


def test_noise_and_a_slow_drift_do_not_fire():
    base = noisy(0.5, 0)
    drift = noisy(1.0, 1)
    events = run({KEY_A: base, KEY_B: lambda s: drift(s) * 1.02 ** s, LOSS: lambda s: 4.0 - 0.01 * s}, 150)
    assert events == []


def test_a_jump_fires_at_its_step_and_names_the_earliest_series_first():
    a, b = noisy(0.5, 2), noisy(2.0, 3)
    events = run({KEY_A: lambda s: a(s) * (1000 if s >= 40 else 1), KEY_B: lambda s: b(s) * (50 if s >= 40 else 1)},
                 80)
    assert [e.step for e in events] == [40]  # one incident: quiet for a window after
    first, second = events[0].departures
    assert first.name == "b.weight" and second.name == "a.weight"  # b is made first (order), though a jumped more
    assert second.factor > 500 and first.z > 8


def test_a_nan_fires_without_history_and_a_flat_series_is_judged_against_its_floor():
    lr = ("lr", "lr")
    events = run({KEY_A: lambda s: math.nan if s == 2 else 1.0, lr: lambda s: 1e-3 * (1.01 if s == 30 else 1)}, 40)
    assert [(e.step, e.first.name) for e in events] == [(2, "a.weight")]
    assert math.isinf(events[0].first.z) and events[0].first.reason == "NaN"


def test_a_loss_is_judged_linearly_and_upwards_only():
    events = run({LOSS: lambda s: -2.0 + 0.001 * (s % 3) + (3.0 if s == 25 else -3.0 if s == 12 else 0.0)}, 40)
    assert [(e.step, e.first.kind) for e in events] == [(25, "loss")]
    assert events[0].first.median == pytest.approx(-2.0, abs=0.01)


def test_a_series_that_appears_late_warms_up_on_its_own_then_is_judged():
    det = detector()
    c = noisy(1.0, 4)
    fired = []
    for step in range(60):
        values = {KEY_A: c(step)}
        if step >= 20:  # a layer unfrozen at step 20
            values[KEY_B] = c(step + 1) * (0.001 if step == 40 else 1.0)
        event = update(det, step, values)
        fired += [(event.step, d.name) for d in event.departures] if event else []
    assert fired == [(40, "b.weight")]


def test_a_norm_that_falls_must_collapse_to_count():
    a, b = noisy(1.0, 5), noisy(1.0, 6)
    events = run({KEY_A: lambda s: a(s) / (4 if s == 30 else 1), KEY_B: lambda s: b(s) / (100 if s == 30 else 1)}, 40)
    assert [(e.step, [d.name for d in e.departures]) for e in events] == [(30, ["b.weight"])]
