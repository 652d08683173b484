"""The online detector: a robust band (median and MAD over a sliding window) per series.

Each tracked series gives one number per step: a tensor's L2 norm (judged in log10, so a
1000x jump is 3 units whatever the tensor's scale), the loss (judged as it is) or the
learning rate (log10). A value departs when its robust z-score,
``|x - median| / max(1.4826 * MAD, floor)``, over the last ``window`` values exceeds
``threshold``, once the series has ``warmup`` values. A norm that falls must also fall by
``DROP`` decades (10x): a gradient's norm over a small batch drops by cancellation far more
often than it jumps, and a fall that matters is a collapse. The floor (0.05 in log10, i.e. ~12%;
1% of the median for the loss) keeps a flat series (a constant learning rate) from firing
on rounding. A NaN or Inf (a non-finite norm, NaN/Inf counts above 0) departs at once,
with no history needed. A series that departed is not reported again for ``window``
steps: one incident, one event.

All series are judged together with numpy (one median over a ``[series, window]`` array
per step), so the cost does not grow with Python calls per series.
"""

from __future__ import annotations

import math

import numpy as np

from opscope.monitor.events import Departure, MonitorEvent

LOG_FLOOR = 0.05
LINEAR_FLOOR = 0.01
DROP = 1.0
TINY = 1e-30
Key = tuple[str, str]


def _transform(kind: str, value: float) -> float:
    if kind == "loss":
        return value
    return math.log10(max(abs(value), TINY))


class BandDetector:
    """Judges every series of a run at each step. See the module docstring."""

    def __init__(self, window: int, threshold: float, warmup: int) -> None:
        self.window, self.threshold, self.warmup = window, threshold, warmup
        self.keys: list[Key] = []
        self.index: dict[Key, int] = {}
        self.buf = np.full((0, window), np.nan)
        self.count = np.zeros(0, dtype=np.int64)
        self.quiet_until = np.zeros(0, dtype=np.int64)
        self.linear = np.zeros(0, dtype=bool)

    def _add(self, key: Key) -> int:
        i = self.index[key] = len(self.keys)
        self.keys.append(key)
        self.buf = np.vstack([self.buf, np.full((1, self.window), np.nan)])
        self.count = np.append(self.count, 0)
        self.quiet_until = np.append(self.quiet_until, -1)
        self.linear = np.append(self.linear, key[0] == "loss")
        return i

    def update(self, step: int, rank: int, values: dict[Key, tuple[float, float]],
               order: dict[Key, int]) -> MonitorEvent | None:
        """Judge one step: ``values[key] = (value, nonfinite count)``. Returns the step's
        event (departures earliest first) or None; then adds the values to the windows."""
        rows = np.array([self.index[k] if k in self.index else self._add(k) for k in values], dtype=np.int64)
        if not len(rows):
            return None
        raw = np.array([v for v, _ in values.values()], dtype=np.float64)
        bad = np.array([c for _, c in values.values()], dtype=np.float64)
        x = np.where(self.linear[rows], raw, np.log10(np.maximum(np.abs(raw), TINY)))
        nonfinite = ~np.isfinite(raw) | (bad > 0)
        z, median = self._score(rows, x)
        awake = self.quiet_until[rows] < step
        out = awake & (nonfinite | (z > self.threshold))
        departures = [self._departure(self.keys[rows[j]], raw[j], median[j], z[j], bool(nonfinite[j]), bad[j],
                                      order) for j in np.flatnonzero(out)]
        self.quiet_until[rows[out]] = step + self.window
        ok = np.isfinite(x) & ~nonfinite
        slot = self.count[rows[ok]] % self.window
        self.buf[rows[ok], slot] = x[ok]
        self.count[rows[ok]] += 1
        if not departures:
            return None
        departures.sort(key=lambda d: (d.order, -d.z))
        return MonitorEvent(step=step, rank=rank, departures=departures)

    def _score(self, rows: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ready = self.count[rows] >= self.warmup
        z = np.zeros(len(rows))
        median = np.full(len(rows), np.nan)
        if not ready.any():
            return z, median
        window = self.buf[rows[ready]]
        full = self.count[rows[ready]] >= self.window
        med = np.empty(len(window))
        mad = np.empty(len(window))
        if full.all():  # the common case once warmed up: no NaN in the windows
            med[:] = np.median(window, axis=1)
            mad[:] = np.median(np.abs(window - med[:, None]), axis=1)
        else:
            med[:] = np.nanmedian(window, axis=1)
            mad[:] = np.nanmedian(np.abs(window - med[:, None]), axis=1)
        linear = self.linear[rows[ready]]
        floor = np.where(linear, LINEAR_FLOOR * np.abs(med) + 1e-12, LOG_FLOOR)
        scale = np.maximum(1.4826 * mad, floor)
        delta = x[ready] - med
        falls_little = ~linear & (delta < 0) & (-delta < DROP)
        z[ready] = np.where(falls_little, 0.0, np.abs(delta) / scale)
        median[ready] = np.where(linear, med, 10.0 ** med)
        return z, median

    @staticmethod
    def _departure(key: Key, value: float, median: float, z: float, nonfinite: bool, bad: float,
                   order: dict[Key, int]) -> Departure:
        kind, name = key
        if nonfinite:
            what = "NaN" if math.isnan(value) or bad > 0 and not math.isinf(value) else "Inf"
            reason = f"{what} ({int(bad)} non-finite values)" if bad > 0 else what
            z = math.inf
        else:
            reason = f"{value:.4g} against a median of {median:.4g} (z={z:.1f})"
        stat = "value" if kind in ("loss", "lr") else "norm"
        return Departure(kind=kind, name=name, stat=stat, value=float(value), median=float(median), z=float(z),
                         order=order.get(key, 1 << 30), reason=reason)
