"""Statistics measured inside the graph by the ``OpscopeStats`` op (:mod:`.opbuild`).

A statistics dump without a watch adds to each traced graph ``OpscopeStats`` ops over the
values of the kernel's dtypes (``stats.CODES``), :data:`CHUNK` values each: each gives back
their statistics as columns, float64 ``[10, n]`` as ``stats_many`` writes them, and their
shapes (``[rank, dims...]`` per value); the graph concatenates them. The graph's host callback
then receives those two small arrays, and the values of other dtypes (complex, unsigned wider
than a byte: numpy measures them, as before), instead of ~1,100 arrays. :func:`measured` puts
them together into the columns the writer takes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from opscope.capture.tensorflow import absent
from opscope.capture.tensorflow import stats as st
from opscope.capture.tensorflow.stats import Measured

# Values per op: an op runs as soon as its values are made, on a TensorFlow thread, while
# the graph goes on (and reads them while they are likely in cache); one op for all ran at
# the end of the step (see docs/tensorflow.md, session 11: 8 and 16 measured best, 8 with less CPU).
CHUNK = 8
_NONE_ROWS = np.array([0, 1, 2, 3, 5])  # an empty value's None statistics: min, max, mean, std, absmax


class InGraph(NamedTuple):
    """Which of a graph's values the op measures, which the host callback receives."""

    inside: np.ndarray  # value indexes, in the op's order
    host: np.ndarray    # value indexes handed to the host as arrays
    n: int
    dtypes: list[str]   # the op's values' dtype names (the graph's)


def add(plan: Any, values: list[Any], lib: Any, graph_ran: Callable[..., None]) -> bool:
    """Add the op and the host callback that receives its outputs to the graph being traced;
    False (nothing added) when no value is of the kernel's dtypes."""
    import tensorflow as tf

    inside = [i for i, t in enumerate(values) if t.dtype.name in st.CODES]
    if not inside:
        return False
    host = [i for i, t in enumerate(values) if t.dtype.name not in st.CODES]
    plan.__dict__["in_graph"] = InGraph(np.array(inside, np.int64), np.array(host, np.int64), len(values),
                                        [values[i].dtype.name for i in inside])
    ins = [values[i] for i in inside]
    step = CHUNK or len(ins)
    with tf.name_scope("opscope_dump"):  # the op callback skips the dump's own ops by this name
        parts = [lib.opscope_stats(ins[k:k + step]) for k in range(0, len(ins), step)]
        stats, dims = parts[0]
        if len(parts) > 1:
            stats, dims = tf.concat([p[0] for p in parts], 1), tf.concat([p[1] for p in parts], 0)
        tf.numpy_function(graph_ran, [stats, dims, *[values[i] for i in host]], Tout=[], stateful=True,
                          name="opscope_dump")
    return True


def measured(plan: Any, arrays: list[Any]) -> Measured:
    """A graph run's values as columns, from what its ``OpscopeStats`` op and host callback
    handed over (``[stats, dims, *host values]``): the columns
    :func:`opscope.capture.tensorflow.columns.measure` makes of every value's array (absent
    values marked: :func:`.absent.mark`)."""
    got: InGraph = plan.__dict__["in_graph"]
    shapes, empty = _op_shapes(plan, np.asarray(arrays[1]))
    others = [np.asarray(a) for a in arrays[2:]]
    if not others:  # the usual case: the op measured every value
        stats = np.array(arrays[0], dtype=np.float64)  # a copy: TensorFlow reuses its buffer
        nulls = None
        if len(empty):
            nulls = np.zeros(stats.shape, bool)
            nulls[np.ix_(_NONE_ROWS, empty)] = True
        return absent.mark(plan, Measured(stats, nulls, shapes, got.dtypes))
    host_stats, host_nulls = st.many_columns(others)
    stats = np.empty((10, got.n), np.float64)
    stats[:, got.inside] = np.asarray(arrays[0])
    stats[:, got.host] = host_stats
    nulls = None
    if len(empty) or host_nulls is not None:
        nulls = np.zeros(stats.shape, bool)
        nulls[np.ix_(_NONE_ROWS, got.inside[empty])] = True
        if host_nulls is not None:
            nulls[:, got.host] = host_nulls
    every: list[Any] = [None] * got.n
    dtypes: list[str] = [""] * got.n
    for k, i in enumerate(got.inside.tolist()):
        every[i], dtypes[i] = shapes[k], got.dtypes[k]
    for a, i in zip(others, got.host.tolist(), strict=True):
        every[i], dtypes[i] = a.shape, st.name_of(a)
    return absent.mark(plan, Measured(stats, nulls, every, dtypes))


def _op_shapes(plan: Any, dims: np.ndarray) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """The op's values' shapes and the indexes (in the op's order) of the empty ones, decoded
    from its ``dims`` output; kept while a graph's runs give the same (the usual case)."""
    key = dims.tobytes()
    cached = plan.__dict__.get("op_shapes")
    if cached is not None and cached[0] == key:
        return cached[1], cached[2]
    flat = dims.tolist()
    shapes: list[tuple[int, ...]] = []
    at = 0
    while at < len(flat):
        rank = flat[at]
        shapes.append(tuple(flat[at + 1:at + 1 + rank]))
        at += 1 + rank
    empty = np.array([k for k, s in enumerate(shapes) if 0 in s], np.int64)
    plan.__dict__["op_shapes"] = (key, shapes, empty)
    return shapes, empty
