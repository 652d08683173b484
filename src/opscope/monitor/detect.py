"""The online detector: a robust band (median and MAD over a sliding window) per series.

Each tracked series gives one number per step: a tensor's L2 norm (judged in log10, so a
1000x jump is 3 units whatever the tensor's scale), the loss (judged as it is) or the
learning rate (log10). A value departs when its robust z-score,
``|x - median| / max(1.4826 * MAD, floor)``, over the last ``window`` values exceeds
``threshold``, once the series has ``warmup`` values (below 16 values the threshold is
raised by ``sqrt(16 / n)``: a median and MAD of few values are loose), *and* it moved by
at least a smallest amount (the z-score says a move is unusual for the series, this says it
is large enough to be trouble; on healthy training of real models the z-score alone fired):

- a norm: ``move_decades`` (default ``MOVE``: 2 decades, 100x), up or down (squared kinds,
  Adam's ``exp_avg_sq``: twice the decades, the same move of the gradient). Healthy tiny models moved a layer's gradient
  15x for a step, a small bias's gradient or weight 20x down by cancellation;
- the loss: up only, by ``loss_rise`` (default ``RISE``: 25%) of its median (a loss that
  falls is learning; a batch seen after a longer gap came back 10% higher);
- the learning rate: up only, by any amount beyond the band (it is set by code: a rise out
  of a smooth schedule is deliberate or a bug; a decay, a step down, an end at 0 are not);
- never against a band of zeros (a bias that gets no gradient: 0, then rounding's 1e-22).

The floor (0.05 in log10, i.e. ~12%; 1% of the median for the loss) keeps a flat series (a
constant learning rate) from firing on rounding. A NaN or Inf (a non-finite norm, NaN/Inf
counts above 0) departs at once, with no history needed. Activations and their gradients
(``INNER_KINDS``) are named when they move in a step where something else departs (they
may be where it starts), but alone, finite, they make no event: backward and the optimizer
absorbed it (a healthy tiny Llama's gradient at its first norm's output jumped 1e4x for
one step, with no trace in any parameter's gradient or the loss). A series that departed
is not reported again for ``window`` steps: one incident, one event.

All series of a step are judged in one call of the monitor's native module (``band`` in
``monitor/_c/band.c``: one pass per series, the GIL released), so the cost does not grow
with Python calls per series; without a C compiler at install, by numpy on all series
together (a sort of a ``[series, window]`` array; ~70 numpy calls a step, whose overhead
made the cost on ~100 series). The two give the same state and events
(``tests/unit/monitor/test_monitor_band.py``). A series' band is recomputed every
``REFRESH`` (4) steps of its own once its window is full (each step before), which the
slowly moving window allows (a jump is judged against a band made from the steps before it
either way).

The state is one quantity after another in one buffer (a view of each by name), indexed by
the series' id (:mod:`~opscope.monitor.registry`), ~51 bytes a series with the default
window of 32: the windows of log10 values as int8 in steps of 1/32 decade around a base of
its own (int16; +-3.97 decades around it, clipped beyond), which is moved to the median each
time the band is computed (a value clipped is an outlier: the median and MAD hold) and,
before a series is judged or while its band is of zeros, to a value that does not fit (a
learning rate of 0 at the first step is clipped instead); a norm of 0 has a code of its own
(-128), which no base moves; those of linear series (the loss) as float64; the flags of its
kind, the count of values, the step until which a series is quiet (int32), the band (median
and MAD, float32). The rounding (1/64 decade at most) moves a z-score by 0.3 at most at the
0.05 floor, against a smallest move of 2 decades (z = 40 there) for a norm; the learning
rate, judged without one, is a flat series whose values are its base.
"""

from __future__ import annotations

import math

import numpy as np

from opscope.monitor.events import Departure, MonitorEvent
from opscope.monitor.registry import SeriesTable

try:  # the batched kernel's module: built with the package, absent without a C compiler
    from opscope.monitor import _monstats  # type: ignore[attr-defined]

    _BAND = getattr(_monstats, "band", None)
except ImportError:
    _BAND = None

LOG_FLOOR = 0.05
LINEAR_FLOOR = 0.01
MOVE = 2.0  # default: decades (100x) a norm must move by, either way, to depart (squared kinds: twice that)
RISE = 0.25  # default: a fraction of |median| the loss must rise by to depart
FEW = 16  # below this many values in its window, a series needs a larger z to depart
REFRESH = 4  # steps between two computations of a series' band (its median and MAD)
TINY = 1e-30
ZERO = -29.0  # log10: a band whose median is this low is of zeros, against which no ratio means anything
QUANTUM = 32  # steps per decade of the windows of log10 values: int8 around a base (+-3.97 decades)
_LIMIT = 127
_ZERO_CODE = -128  # a norm of 0 (log10 at the TINY floor) in a window, whatever the base
_ZERO_VALUE = math.log10(TINY)  # what that code reads as
LINEAR_KINDS = ("loss",)  # judged as they are; the others in log10
UPWARD_KINDS = ("loss", "lr")  # only a rise departs: a loss that falls is learning, a rate that falls a schedule
SET_KINDS = ("lr",)  # set by code, not measured: judged by the band alone, no smallest move
SQUARED_KINDS = ("exp_avg_sq", "max_exp_avg_sq")  # in units of a gradient squared
INNER_KINDS = ("activation", "activation_grad")  # name where trouble starts; alone (finite), no event
LINEAR, UPWARD, SET, SQUARED, INNER = 1, 2, 4, 8, 16  # bits of a series' flags
_FLAGS = ((LINEAR, LINEAR_KINDS), (UPWARD, UPWARD_KINDS), (SET, SET_KINDS), (SQUARED, SQUARED_KINDS),
          (INNER, INNER_KINDS))


_NONE = np.zeros(0, dtype=np.int64)


def _middle(ordered: np.ndarray) -> np.ndarray:
    """The median of each row of a row-sorted array."""
    n = ordered.shape[1]
    return (ordered[:, (n - 1) // 2] + ordered[:, n // 2]) / 2


class BandDetector:
    """Judges every series of a run at each step. See the module docstring.

    Args:
        window, threshold, warmup: the config's.
        series: the session's series (names and places of the ids given to :meth:`update`).
        move_decades: the smallest move of a norm that departs, in decades (squared kinds: twice).
        loss_rise: the smallest rise of the loss that departs, a fraction of its median.
    """

    native = _BAND is not None  # judge in the native module (False: numpy; tests compare the two)

    def __init__(self, window: int, threshold: float, warmup: int, series: SeriesTable | None = None, *,
                 move_decades: float = MOVE, loss_rise: float = RISE) -> None:
        self.window, self.threshold, self.warmup = window, threshold, warmup
        self.move_decades, self.loss_rise = move_decades, loss_rise
        self.series = series if series is not None else SeriesTable()
        self._n = self._nlin = 0  # series, and linear ones among them
        self._state = np.zeros(0, dtype=np.uint8)  # every quantity below, packed (see _fields)

    def _fields(self, n: int, nlin: int) -> list[tuple[str, np.dtype, tuple[int, ...], int]]:
        """Where each quantity sits in the packed state of ``n`` series (``nlin`` linear):
        ``(name, dtype, shape, offset in bytes)``, the widest first (each aligned). One buffer,
        not nine arrays: each array held costs ~100 B of header, and numpy's cached buffer info
        (~60 B) once handed to the native step."""
        w = self.window
        layout = [("lins", np.float64, (nlin, w)),  # the linear series' (the loss's) values, a row each
                  ("lin_ids", np.int64, (nlin,)),  # the linear series, ascending
                  ("count", np.int32, (n,)),  # values each series has had
                  ("quiet_until", np.int32, (n,)),  # the step until which it is quiet
                  ("med", np.float32, (n,)), ("mad", np.float32, (n,)),  # the band when last computed
                  ("base", np.int16, (n,)),  # in 1/QUANTUM decades: the median when last computed
                  ("flags", np.uint8, (n,)),  # LINEAR, UPWARD, SET, SQUARED, INNER
                  ("logs", np.int8, (n, w))]  # log10 values - base, in 1/QUANTUM decades (a spare row for a linear one)
        out, at = [], 0
        for name, dtype, shape in layout:
            out.append((name, np.dtype(dtype), shape, at))
            at += math.prod(shape) * np.dtype(dtype).itemsize
        return out

    def _view(self, name: str) -> np.ndarray:
        """The quantity ``name`` of the packed state (a view: writes go to the state)."""
        for field, dtype, shape, at in self._fields(self._n, self._nlin):
            if field == name:
                return self._state[at:at + math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)
        raise KeyError(name)

    flags = property(lambda self: self._view("flags"), doc="Per series: its kind's bits (LINEAR, ...).")
    logs = property(lambda self: self._view("logs"), doc="The log windows, int8 around each series' base.")
    base = property(lambda self: self._view("base"), doc="Each log window's base, in 1/QUANTUM decades.")
    lin_ids = property(lambda self: self._view("lin_ids"), doc="The linear series' ids, ascending.")
    lins = property(lambda self: self._view("lins"), doc="The linear series' windows, float64.")
    count = property(lambda self: self._view("count"), doc="Values each series has had.")
    quiet_until = property(lambda self: self._view("quiet_until"), doc="The step until which a series is quiet.")
    med = property(lambda self: self._view("med"), doc="Each band's median (judged units), float32.")
    mad = property(lambda self: self._view("mad"), doc="Each band's MAD (judged units), float32.")

    @property
    def linear(self) -> np.ndarray:
        """Per series: judged as it is (True) or in log10."""
        return (self.flags & LINEAR) > 0

    @property
    def size(self) -> int:
        """Series the detector holds state for."""
        return self._n

    def _grow(self, n: int) -> None:
        """State for series ids up to ``n - 1`` (new ids come in groups: one step's), exactly:
        no spare room."""
        old, kinds, kind_of = self._n, self.series.kinds, self.series.kind_of
        flags = np.array([sum(bit for bit, of in _FLAGS if kinds[kind_of[i]] in of) for i in range(old, n)],
                         dtype=np.uint8)
        lin_ids = np.concatenate([self.lin_ids, old + np.flatnonzero((flags & LINEAR) > 0)])
        before = {name: self._view(name) for name, *_ in self._fields(old, self._nlin)}
        fields = self._fields(n, len(lin_ids))
        *_, (_, dtype, shape, at) = fields
        self._state = np.zeros(at + math.prod(shape) * dtype.itemsize, dtype=np.uint8)
        self._n, self._nlin = n, len(lin_ids)
        fill = {"lins": np.nan, "quiet_until": -1, "med": np.nan, "mad": np.nan}
        for name, *_ in fields:
            view = self._view(name)
            view[...] = fill.get(name, 0)
            view[:len(before[name])] = before[name]
        self.lin_ids[:] = lin_ids
        self.flags[old:] = flags

    def update(self, step: int, rank: int, ids: np.ndarray, raw: np.ndarray, bad: np.ndarray) -> MonitorEvent | None:
        """Judge one step: series ``ids[i]`` has value ``raw[i]`` and ``bad[i]`` NaN/Inf. Returns
        the step's event (departures earliest first) or None; then adds the values to the windows."""
        if not len(ids):
            return None
        rows = np.ascontiguousarray(ids, dtype=np.int64)
        top = int(rows.max())
        if top >= self.size:
            self._grow(top + 1)
        raw = np.ascontiguousarray(raw, dtype=np.float64)
        bad = np.ascontiguousarray(bad, dtype=np.float64)
        logx = np.log10(np.maximum(np.abs(raw), TINY))
        judged = self._judge_native(step, rows, logx, raw, bad) if self.native else None
        at, z, median = judged if judged is not None else self._judge(step, rows, logx, raw, bad)
        if not len(at):
            return None
        departures = [self._departure(int(rows[j]), float(raw[j]), float(median[j]), float(z[j]), float(bad[j]))
                      for j in at]
        departures.sort(key=lambda d: (d.order, -d.z))
        return MonitorEvent(step=step, rank=rank, departures=departures)

    def _judge_native(self, step: int, rows: np.ndarray, logx: np.ndarray, raw: np.ndarray,
                      bad: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """:meth:`_judge` in one native call; None when an id repeats in ``rows`` (then numpy,
        whose fancy assignment keeps one of its values)."""
        z, median, out = np.empty(len(rows)), np.empty(len(rows)), np.zeros(len(rows), dtype=np.bool_)
        assert _BAND is not None
        departed = _BAND(self._state, self._n, self._nlin, rows, logx, raw, bad, z, median, out, step, self.window,
                         self.warmup, self.threshold, self.move_decades, self.loss_rise, FEW, REFRESH, _ZERO_VALUE)
        if departed < 0:
            return None
        return np.flatnonzero(out) if departed else _NONE, z, median

    def _judge(self, step: int, rows: np.ndarray, logx: np.ndarray, raw: np.ndarray,
               bad: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Score every value, mark the departed quiet, add the values to the windows. Returns
        the positions in ``rows`` that depart, the z-scores and the bands' medians (in judged
        units: log10 for a norm; NaN where not judged yet)."""
        x = np.where(self.linear[rows], raw, logx)
        nonfinite = ~np.isfinite(raw) | (bad > 0)
        z, median = self._score(rows, x)
        awake = self.quiet_until[rows] < step
        # few values make a loose band: the threshold grows as sqrt(FEW / n) below FEW values
        n = np.minimum(self.count[rows], self.window)
        limit = self.threshold * np.sqrt(np.maximum(1.0, FEW / np.maximum(n, 1)))
        out = awake & (nonfinite | (z > limit))
        if not (nonfinite[out].any() or (self.flags[rows[out]] & INNER == 0).any()):
            out[:] = False  # activations alone: backward and the optimizer absorbed it
        self.quiet_until[rows[out]] = step + self.window
        self._remember(rows, x, np.isfinite(x) & ~nonfinite)
        return np.flatnonzero(out), z, median

    def _remember(self, rows: np.ndarray, x: np.ndarray, ok: np.ndarray) -> None:
        """Each finite value into its series' window (the oldest one out)."""
        lin = self.linear[rows]
        slot = self.count[rows] % self.window
        keep = ok & lin
        self.lins[self._lin_row(rows[keep]), slot[keep]] = x[keep]
        keep = ok & ~lin
        at = rows[keep]
        q = np.rint(x[keep] * QUANTUM)
        zero = x[keep] <= ZERO  # a 0: its own code, never clipped nor moved
        # a value that does not fit moves the base there while the series is not judged yet, or
        # while its band is of zeros (an outlier before, a learning rate of 0 at step 0, is clipped)
        unjudged = (self.count[at] < self.warmup) | ~(self.med[at] > ZERO)
        move = ~zero & unjudged & ((self.count[at] == 0) | (np.abs(q - self.base[at]) > _LIMIT))
        if move.any():
            self._rebase(at[move], q[move] / QUANTUM)
        self.logs[at, slot[keep]] = np.where(zero, _ZERO_CODE, np.clip(q - self.base[at], -_LIMIT, _LIMIT))
        self.count[rows[ok]] += 1

    def _lin_row(self, rows: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.lin_ids, rows)

    def _rebase(self, rows: np.ndarray, med: np.ndarray) -> None:
        """The windows of log series ``rows`` re-centred on their medians (a value that ends up
        beyond +-3.97 decades of it is clipped there: it was an outlier, the median and MAD hold)."""
        rows, med = rows[med > ZERO], med[med > ZERO]  # a band of zeros keeps its base
        new = np.clip(np.rint(med * QUANTUM), -30 * QUANTUM, 30 * QUANTUM).astype(np.int16)
        shift = (new.astype(np.int32) - self.base[rows])[:, None]
        old = self.logs[rows]
        moved = np.clip(old.astype(np.int32) - shift, -_LIMIT, _LIMIT)
        self.logs[rows] = np.where(old == _ZERO_CODE, _ZERO_CODE, moved)
        self.base[rows] = new

    def _score(self, rows: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ready = self.count[rows] >= self.warmup
        z = np.zeros(len(rows))
        median = np.full(len(rows), np.nan)
        if not ready.any():
            return z, median
        judged = rows[ready]
        count = self.count[judged]
        stale = judged[(count % REFRESH == 0) | (count < self.window)]  # each step while filling
        if len(stale):
            self.med[stale], self.mad[stale] = med, _ = self._median_mad(stale)
            logs = ~self.linear[stale]
            self._rebase(stale[logs], med[logs])
        med, mad = self.med[judged].astype(np.float64), self.mad[judged].astype(np.float64)
        flags = self.flags[judged]
        linear = (flags & LINEAR) > 0
        floor = np.where(linear, LINEAR_FLOOR * np.abs(med) + 1e-12, LOG_FLOOR)
        scale = np.maximum(1.4826 * mad, floor)
        delta = x[ready] - med
        # the smallest move that departs: loss_rise of the loss; none for the lr; move_decades for a
        # norm (squared: twice that); and none against a band of zeros
        move = self.move_decades * (1 + ((flags & SQUARED) > 0))
        least = np.where(linear, self.loss_rise * np.abs(med), np.where(flags & SET, 0.0, move))
        within = (np.abs(delta) < least) | ((delta < 0) & ((flags & UPWARD) > 0)) | (~linear & (med <= ZERO))
        z[ready] = np.where(within, 0.0, np.abs(delta) / scale)
        median[ready] = med
        return z, median

    def _windows(self, rows: np.ndarray, n: int) -> np.ndarray:
        """The first ``n`` values of each series' window, as float64 in the series' units."""
        lin = self.linear[rows]
        out = np.empty((len(rows), n))
        out[lin] = self.lins[self._lin_row(rows[lin]), :n]
        at = rows[~lin]
        logs = self.logs[at, :n]
        values = (logs + self.base[at, None].astype(np.float64)) / QUANTUM
        out[~lin] = np.where(logs == _ZERO_CODE, math.log10(TINY), values)
        return out

    def _median_mad(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Median and MAD of each row's window. A window that is not full holds its values in
        its first ``count`` slots, so rows are taken in groups of equal fill (one group once
        warmed up), each sorted once (``np.median`` costs twice as much here)."""
        fill = np.minimum(self.count[rows], self.window)
        med, mad = np.empty(len(rows)), np.empty(len(rows))
        for n in sorted(set(fill.tolist())):  # not np.unique: its first call imports numpy.ma (40 ms)
            at = np.flatnonzero(fill == n)
            window = self._windows(rows[at], n)
            med[at] = m = _middle(np.sort(window, axis=1))
            mad[at] = _middle(np.sort(np.abs(window - m[:, None]), axis=1))
        return med, mad

    def _departure(self, i: int, value: float, band: float, z: float, bad: float) -> Departure:
        kind, name = self.series.key(i)
        median = band if self.flags[i] & LINEAR else 10.0 ** band
        if not math.isfinite(value) or bad > 0:
            what = "NaN" if math.isnan(value) or bad > 0 and not math.isinf(value) else "Inf"
            reason = f"{what} ({int(bad)} non-finite values)" if bad > 0 else what
            z = math.inf
        else:
            reason = f"{value:.4g} against a median of {median:.4g} (z={z:.1f})"
        stat = "value" if kind in ("loss", "lr") else "norm"
        return Departure(kind=kind, name=name, stat=stat, value=value, median=median, z=z,
                         order=self.series.order[i], reason=reason)
