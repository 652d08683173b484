"""The online detector: a robust band (median and MAD over a sliding window) per series.

Each tracked series gives one number per step: a tensor's L2 norm (judged in log10, so a
1000x jump is 3 units whatever the tensor's scale), the loss (judged as it is) or the
learning rate (log10). A value departs when its robust z-score,
``|x - median| / max(1.4826 * MAD, floor)``, over the last ``window`` values exceeds
``threshold``, once the series has ``warmup`` values (below 16 values the threshold is
raised by ``sqrt(16 / n)``: a median and MAD of few values are loose). A norm that falls must also fall by
``DROP`` decades (10x): a gradient's norm over a small batch drops by cancellation far more
often than it jumps, and a fall that matters is a collapse. A loss departs only upwards (a
loss that falls faster than its band is training, not trouble). The floor (0.05 in log10, i.e. ~12%;
1% of the median for the loss) keeps a flat series (a constant learning rate) from firing
on rounding. A NaN or Inf (a non-finite norm, NaN/Inf counts above 0) departs at once,
with no history needed. A series that departed is not reported again for ``window``
steps: one incident, one event.

All series are judged together with numpy (a sort of a ``[series, window]`` array), so the
cost does not grow with Python calls per series; a series' band is recomputed every
``REFRESH`` (4) steps of its own once its window is full (each step before), which the
slowly moving window allows (a jump is judged
against a band made from the steps before it either way).
"""

from __future__ import annotations

import math

import numpy as np

from opscope.monitor.events import Departure, MonitorEvent

LOG_FLOOR = 0.05
LINEAR_FLOOR = 0.01
DROP = 1.0
FEW = 16  # below this many values in its window, a series needs a larger z to depart
REFRESH = 4  # steps between two computations of a series' band (its median and MAD)
TINY = 1e-30
Key = tuple[str, str]


def _transform(kind: str, value: float) -> float:
    if kind == "loss":
        return value
    return math.log10(max(abs(value), TINY))


def _middle(ordered: np.ndarray) -> np.ndarray:
    """The median of each row of a row-sorted array."""
    n = ordered.shape[1]
    return (ordered[:, (n - 1) // 2] + ordered[:, n // 2]) / 2


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
        self.med = np.zeros(0)
        self.mad = np.zeros(0)
        self.band_at = np.zeros(0, dtype=np.int64)
        self._rows: dict[tuple[Key, ...], np.ndarray] = {}  # a step's keys (the same tuple each step) -> rows

    def _add(self, key: Key) -> int:
        i = self.index[key] = len(self.keys)
        self.keys.append(key)
        self.buf = np.vstack([self.buf, np.full((1, self.window), np.nan)])
        self.count = np.append(self.count, 0)
        self.quiet_until = np.append(self.quiet_until, -1)
        self.linear = np.append(self.linear, key[0] == "loss")
        self.med, self.mad = np.append(self.med, np.nan), np.append(self.mad, np.nan)
        self.band_at = np.append(self.band_at, -(1 << 40))
        return i

    def update(self, step: int, rank: int, keys: tuple[Key, ...], raw: np.ndarray, bad: np.ndarray,
               order: dict[Key, int]) -> MonitorEvent | None:
        """Judge one step: series ``keys[i]`` has value ``raw[i]`` and ``bad[i]`` NaN/Inf. Returns
        the step's event (departures earliest first) or None; then adds the values to the windows."""
        rows = self._rows.get(keys)
        if rows is None:
            rows = self._rows[keys] = np.array([self.index[k] if k in self.index else self._add(k) for k in keys],
                                               dtype=np.int64)
        if not len(rows):
            return None
        x = np.where(self.linear[rows], raw, np.log10(np.maximum(np.abs(raw), TINY)))
        nonfinite = ~np.isfinite(raw) | (bad > 0)
        z, median = self._score(rows, x)
        awake = self.quiet_until[rows] < step
        # few values make a loose band: the threshold grows as sqrt(FEW / n) below FEW values
        n = np.minimum(self.count[rows], self.window)
        limit = self.threshold * np.sqrt(np.maximum(1.0, FEW / np.maximum(n, 1)))
        out = awake & (nonfinite | (z > limit))
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
        judged = rows[ready]
        count = self.count[judged]
        stale = judged[(count - self.band_at[judged] >= REFRESH) | (count < self.window)]  # each step while filling
        if len(stale):
            self.med[stale], self.mad[stale] = self._median_mad(stale)
            self.band_at[stale] = self.count[stale]
        med, mad = self.med[judged], self.mad[judged]
        linear = self.linear[judged]
        floor = np.where(linear, LINEAR_FLOOR * np.abs(med) + 1e-12, LOG_FLOOR)
        scale = np.maximum(1.4826 * mad, floor)
        delta = x[ready] - med
        falls_little = (delta < 0) & (linear | (-delta < DROP))  # a loss that falls is training
        z[ready] = np.where(falls_little, 0.0, np.abs(delta) / scale)
        median[ready] = np.where(linear, med, 10.0 ** med)
        return z, median

    def _median_mad(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Median and MAD of each row's window. A window that is not full holds its values in
        its first ``count`` slots, so rows are taken in groups of equal fill (one group once
        warmed up), each sorted once (``np.median`` costs twice as much here)."""
        fill = np.minimum(self.count[rows], self.window)
        med, mad = np.empty(len(rows)), np.empty(len(rows))
        for n in sorted(set(fill.tolist())):  # not np.unique: its first call imports numpy.ma (40 ms)
            at = np.flatnonzero(fill == n)
            window = self.buf[rows[at], :n]
            med[at] = m = _middle(np.sort(window, axis=1))
            mad[at] = _middle(np.sort(np.abs(window - m[:, None]), axis=1))
        return med, mad

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
