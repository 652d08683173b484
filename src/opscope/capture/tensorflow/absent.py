"""Values that the graph that ran does not have.

The dump's taps are kept out of Grappler's sight (``_c/tap_passes.cc``: a dumped graph must
compute what the bare graph computes) and put back, after Grappler, on the tensor that holds
each value. A value Grappler pruned (a gradient nothing uses), merged (the inner Add of a
chain it made one AddN) or now computes as another quantity (a product it regrouped) has no
such tensor: its tap reads an empty placeholder of shape :data:`MISSING_SHAPE` instead, and
its rows get no statistics and :data:`NOTE`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opscope.capture.tensorflow.stats import Measured
from opscope.model.records import ABSENT_NOTE as NOTE

MISSING_SHAPE = (0,) * 8  # the placeholder's shape (tap_passes.cc: kMissingRank)
STATS: tuple[Any, ...] = tuple([None] * 10)  # an absent value's statistics, its own object (rows.graph_rows)


def is_missing(shape: Any) -> bool:
    """Whether a value's shape is the placeholder's."""
    return shape is not None and tuple(shape) == MISSING_SHAPE


def static_shape(plan: Any, index: int) -> tuple[int, ...] | None:
    """The value's shape in the traced graph (None where it was not fully known)."""
    shapes = plan.__dict__.get("value_shapes") or []
    shape = shapes[index] if index < len(shapes) else None
    return None if shape is None else tuple(shape)


def mark(plan: Any, run: Measured) -> Measured:
    """``run`` with the values that arrived as placeholders marked: every statistic None,
    the traced graph's shape, their indexes in ``absent``. Found once per shapes list (the
    in-graph op's runs hand over the same one while the shapes stay the same)."""
    cached = plan.__dict__.get("absent_of")
    if cached is None or cached[0] is not run.shapes:
        gone = np.array([i for i, shape in enumerate(run.shapes) if is_missing(shape)], np.int64)
        shapes = list(run.shapes)
        for i in gone.tolist():
            shapes[i] = static_shape(plan, i)
        cached = plan.__dict__["absent_of"] = (run.shapes, gone, shapes)
    _, gone, shapes = cached
    if not len(gone):
        return run
    nulls = np.zeros(run.stats.shape, bool) if run.nulls is None else run.nulls.copy()
    nulls[:, gone] = True
    return run._replace(nulls=nulls, shapes=shapes, absent=gone)


def values(plan: Any, measured: list[Any], notes: list[str]) -> list[Any]:
    """A graph run's value tuples (rows.Value) with the absent ones' replaced: the traced
    graph's shape, no statistics (:data:`STATS`), no data; noted once (:func:`note_once`)."""
    gone = [i for i, v in enumerate(measured) if is_missing(v[1])]
    note_once(plan, len(gone), notes)
    for i in gone:
        shape = static_shape(plan, i)
        numel = None if shape is None else int(np.prod(shape, dtype=np.int64))
        measured[i] = (measured[i][0], None if shape is None else list(shape), numel, STATS, None, None)
    return measured


def note_once(plan: Any, count: int, notes: list[str]) -> None:
    """Add to ``notes`` (the manifest's), once per graph, a line about its absent values."""
    if count and not plan.__dict__.get("absent_noted"):
        plan.__dict__["absent_noted"] = True
        notes.append(f"graph {plan.name}: {count} of {len(plan.values)} measured tensors are absent from the "
                     f"graph that ran (Grappler pruned, merged or rewrote them; the dumped graph computes what "
                     f"a run without the dump computes): their rows have no statistics and the note '{NOTE}'")
