"""The record: one row per captured tensor. Plain data, no torch.

Capture builds rows as Python lists in :data:`COLUMNS` order (cheap on the hot path);
storage turns a list of rows into an Arrow table with :data:`SCHEMA_FIELDS` types.
Statistics are held in one slot (:data:`STATS`, a tuple in :data:`STAT_NAMES` order)
until the rows are written, so a background thread can fill them in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

IO_KINDS = ("input", "output", "param", "grad")

# Name, Arrow type name. The order is the on-disk column order (docs/format.md).
SCHEMA_FIELDS: tuple[tuple[str, str], ...] = (
    ("id", "int64"),
    ("rank", "int32"),
    ("step", "int32"),
    ("seq", "int64"),
    ("phase", "string"),
    ("module", "string"),
    ("op", "string"),
    ("call", "int32"),
    ("io", "string"),
    ("slot", "int32"),
    ("arg", "string"),
    ("dtype", "string"),
    ("shape", "list<int64>"),
    ("device", "string"),
    ("numel", "int64"),
    ("min", "float64"),
    ("max", "float64"),
    ("mean", "float64"),
    ("std", "float64"),
    ("norm", "float64"),
    ("absmax", "float64"),
    ("nan", "int64"),
    ("inf", "int64"),
    ("zeros", "int64"),
    ("hash", "uint64"),
    ("data", "string"),
    ("key", "string"),
    ("producer", "int64"),
    ("param", "string"),
    ("fwd_op", "string"),
    ("node", "string"),
    ("args", "string"),
    ("source", "string"),
    ("note", "string"),
    ("view", "string"),
)

STAT_NAMES = ("min", "max", "mean", "std", "norm", "absmax", "nan", "inf", "zeros", "hash")

# Row layout during capture: every schema column except the statistics, which sit in STATS.
COLUMNS = tuple(name for name, _ in SCHEMA_FIELDS if name not in STAT_NAMES) + ("stats",)
COL = {name: i for i, name in enumerate(COLUMNS)}
STATS = COL["stats"]
NO_STATS: tuple[Any, ...] = (None,) * len(STAT_NAMES)
# The note of a record whose tensor the graph that ran does not have (a TensorFlow graph
# Grappler rewrote: docs/tensorflow.md, "absent"): it holds no statistics and no data.
ABSENT_NOTE = "absent: not in the graph that ran (Grappler removed or rewrote it)"
# Records of tensors that hold no data yet, recorded without statistics: the output of an
# empty-like op, and what an op that only fills its first argument (a random draw into
# dropout's empty_like, fill_, zero_, the destination of copy_) finds there before it writes.
UNINITIALIZED_NOTE = "uninitialized memory (empty): not measured"
UNREAD_NOTE = "overwritten without being read: not measured"
SUBCLASS_NOTE = "tensor subclass dispatched to Python: not measured"  # (its data is not where it says)
WRAPPED_NOTE = "wrapped by torch.func (vmap, grad): not measured"  # a batched tensor has no storage
# an output of a collective (torch.distributed): what it holds arrives when the collective
# completes, on another thread or stream, after the op returned; its next read measures it
COLLECTIVE_NOTE = "filled by a collective when it completes: measured at its next read"
# the first argument of an API call that writes it in place and returns nothing
# (`Tensor.__setitem__`: RWKV's CPU kernel fills its output a position at a time): measured at
# its next read, which has this row for its producer (since session 28; before, it had none)
WRITTEN_NOTE = "written in place by a call that returns nothing: measured at its next read"
NOT_DATA_NOTES = frozenset({UNINITIALIZED_NOTE, UNREAD_NOTE, COLLECTIVE_NOTE, WRITTEN_NOTE})


def new_row(**values: Any) -> list[Any]:
    """A capture row with the given columns set and the rest None (for tests and adapters)."""
    row: list[Any] = [None] * len(COLUMNS)
    row[STATS] = NO_STATS
    for name, value in values.items():
        row[COL[name]] = value
    return row


@dataclass(frozen=True)
class Stats:
    """Statistics of one tensor. ``hash`` is a 64-bit position-weighted content checksum."""

    min: float | None
    max: float | None
    mean: float | None
    std: float | None
    norm: float | None
    absmax: float | None
    nan: int | None
    inf: int | None
    zeros: int | None
    hash: int | None

    @classmethod
    def from_tuple(cls, values: tuple[Any, ...]) -> Stats:
        return cls(*values)
