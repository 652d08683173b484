"""What the verdict passes share: the nodes to judge, the indexes, and reading an error."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from opscope.compare.flow import PASS_THROUGH, base_op
from opscope.compare.metrics import statistics_resolution
from opscope.compare.pair import INPUT_IO, Pair
from opscope.compare.tolerance import NoiseModel, is_float

PAIRED = ("exact", "aligned", "mapped", "flow")
RowKey = tuple[str, int, int, int]  # side, rank, step, id or seq


@dataclass
class Node:
    """One op call to judge: rows of its home side, and the pairs of its outputs."""

    side: str
    rank: int
    step: int
    seq: int
    order: float
    rows: list[dict[str, Any]]
    outputs: list[Pair]
    verdict: str = ""
    in_error: float = 0.0
    worst: Pair | None = None
    owner: dict[str, Any] | None = None  # a module call whose own code made the output
    kind: str = "call"  # or "gradient": a module-level gradient record (no op made it)
    spread_n: int = 0  # elements of the largest input judged from statistics that differs
    graph: tuple[str, dict[str, Any]] | None = None  # (side, first row) of the compiled graph blamed instead
    precision: str | None = None  # the lowest dtype a compiled graph of this call computed in
    moved: int = 0  # 1: its inputs that differ carry bounds from earlier updates; -1: not all (param_moves)

    @property
    def head(self) -> dict[str, Any]:
        return self.outputs[0].home if self.outputs else self.rows[0]


@dataclass
class VerdictState:
    """Everything the passes share: the pairs of one (rank, step) partition at a time (or
    more), and in ``previous`` what :func:`~opscope.compare.verdict.judge` carries from a
    rank's previous step (whether it diverged, its parameters' errors, its noise, the values
    it made that differ: :mod:`opscope.compare.carried`) and the rank's first choice."""

    pairs: list[Pair]
    noise: NoiseModel
    entry: dict[RowKey, Pair] = field(default_factory=dict)
    rows: dict[RowKey, dict[str, Any]] = field(default_factory=dict)
    calls: dict[RowKey, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    consumers: dict[RowKey, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    nodes: list[Node] = field(default_factory=list)
    tainted: set[int] = field(default_factory=set)
    roots: list[tuple[Pair, dict[str, Any], str]] = field(default_factory=list)
    findings: list[Any] = field(default_factory=list)
    first_by_rank: dict[int, Any] = field(default_factory=dict)
    spans: dict[tuple[str, int, int], list[dict[str, Any]]] = field(default_factory=dict)
    ordered: dict[tuple[str, int, int], list[dict[str, Any]]] = field(default_factory=dict)
    span_ends: dict[tuple[str, int, int, int], dict[str, Any]] = field(default_factory=dict)
    extra_nodes: list[Node] = field(default_factory=list)
    previous: dict[int, dict[str, Any]] = field(default_factory=dict)  # per rank: its last judged step
    compiled: bool | None = None  # does any row come from a compiled graph (found on first use)
    collective_fed: list[Any] = field(default_factory=list)  # collectives' values from other ranks (collectives.py)
    indexes: dict[tuple[Any, ...], Any] = field(default_factory=dict)  # (what, side, rank, step, ...): built once


def raw_error(pair: Pair | None) -> float:
    """‖t − r‖ / ‖r‖ of a measured pair (inf for NaN/Inf mismatches), nan when unmeasured.
    Integers and booleans whose hashes differ where their statistics agree (a permutation)
    differ by at least the statistics' resolution: they must match exactly."""
    m = pair.metrics if pair is not None else None
    if not m:
        return math.nan
    if m.get("nan_mismatch") or m.get("inf_mismatch"):
        return math.inf
    diff, ref = m.get("diff_norm", 0.0), m.get("ref_norm", 0.0)
    if diff == 0:
        return exact_differs(pair) if m.get("hash_differs") else 0.0
    return diff / ref if ref > 0 else math.inf


def exact_differs(pair: Pair | None) -> float:
    """The least error of a pair whose hashes differ and whose statistics agree: none for floats
    (their tolerance covers it), the statistics' resolution for integers (exact)."""
    t, r = (pair.t or {}, pair.r or {}) if pair is not None else ({}, {})
    return 0.0 if is_float(t.get("dtype")) else statistics_resolution(t, r)


def producer_entry(state: VerdictState, side: str, rank: int, step: int, producer: int) -> Pair | None:
    """The measured pair of a producer; through one-sided views, layout ops and casts that
    nothing paired (they carry their input's error on), up to the tensor they read."""
    key = (side, rank, step, producer)
    first = state.entry.get(key)
    for _ in range(16):
        pair = state.entry.get(key)
        if pair is not None and pair.metrics:
            return pair
        row = state.rows.get(key)
        if row is None or row.get("io") != "output" or base_op(row.get("op")) not in PASS_THROUGH:
            break
        inputs = [r for r in state.calls.get((side, rank, step, row["cseq"]), [])
                  if r.get("io") in INPUT_IO and r.get("producer") is not None
                  and (r.get("numel") or 0) > 0]
        if len(inputs) != 1:
            break
        own = state.entry.get((side, rank, step, inputs[0]["id"]))
        if own is not None and own.kind in PAIRED and own.metrics:
            return own
        key = (side, rank, step, inputs[0]["producer"])
    return first


def made_with_note(state: VerdictState, node: Node, row: dict[str, Any], note: str) -> dict[str, Any] | None:
    """The row that made input ``row`` (its producer in this step), where that row carries
    ``note`` (an output measured at its next read: a collective's, an empty's), or None."""
    producer = row.get("producer")
    if producer is None:
        return None
    made = state.rows.get((node.side, node.rank, node.step, producer))
    return made if made is not None and made.get("note") == note else None


def frees_reader(row: dict[str, Any], measured: Pair, error: float) -> bool:
    """Does this read free what reads it? Indices, masks and counts that differ (integers,
    booleans): one changed element changes which data is read, not by how much (a token
    routed to another expert), so what the reader makes may differ freely. ``error``: the
    read's :func:`input_error`."""
    return not is_float(row.get("dtype")) and not measured.metrics.get("bit_exact") \
        and (error != 0 or measured.mode == "statistics")


def input_error(state: VerdictState, measured: Pair, *, elementwise: bool = False) -> float:
    """An input's relative error, taken at the most it plausibly is.

    From statistics, the error is a lower bound, and a difference below the statistics'
    resolution does not show at all: an input whose hash differs carries at least that.
    (How much more noise spread over many elements may hide is weighed against the size of
    the output it feeds, in :func:`statistics_spread`.)

    ``elementwise``: the op divides element by element (Adam-like updates), so an element
    that is noise on both sides (a gradient that is zero in truth) legitimately becomes a
    full-size update: the input's error counts as its ``elem_rel_rms`` (tensors), or as the
    most it may be (statistics, which cannot see elements).
    """
    error = raw_error(measured)
    if measured.metrics.get("extremes_only") and error > 0 and not measured.metrics.get("bit_exact"):
        # Infs on both sides (scores masked with -inf): only the finite extremes' shift is
        # known, relative to an element's scale, which says nothing of how much the input
        # carries into an output (beam search's scores plus a -inf mask at T5's step 2)
        return math.inf
    if elementwise and measured.mode != "statistics":
        error = max(error, measured.metrics.get("elem_rel_rms") or 0.0)
    if measured.mode != "statistics" or measured.metrics.get("bit_exact") or math.isnan(error):
        return error
    if elementwise:
        return max(error, _cap(measured))
    return max(error, statistics_resolution(measured.t or {}, measured.r or {}))


def statistics_spread(n_in: int, n_out: int) -> float:
    """How much more a statistics-only input error may be, seen from an output of ``n_out``
    elements: noise spread over n elements moves the norm, mean and spread by about 1/sqrt(n)
    of its size, so bounds taken over many input elements understate it sqrt(n_in / n_out)
    times beside a bound over few output elements (a layer norm's saved statistics, a bias
    gradient). 1 when the output is as large as the input (elementwise ops keep their
    ratio, and faults there are still found)."""
    return math.sqrt(n_in / n_out) if n_out > 0 and n_in > n_out else 1.0


def _cap(measured: Pair) -> float:
    """The most a relative error can be: (||t|| + ||r||) / ||r||."""
    t = measured.t or {}
    ref_norm = measured.metrics.get("ref_norm") or 0.0
    t_norm = t.get("norm")
    t_norm = float(t_norm) if t_norm is not None and math.isfinite(t_norm) else ref_norm
    return (t_norm + ref_norm) / ref_norm if ref_norm > 0 else math.inf


def finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0


def finite_or_inf(x: float) -> float:
    return 0.0 if math.isnan(x) else x


def join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b
