"""Activation checkpointing's recomputation against the forward it repeats, row by row: what
compare's verdict pass (:mod:`opscope.compare.recompute`) and ``opscope show`` both ask.

A recomputed record (phase ``recompute``) repeats the forward call of the same (rank, step,
module, op, call index, io, slot); it remade that call's value where it holds the same bytes
(the same content hash, element count and dtype).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

Row = dict[str, Any]
Key = tuple[Any, ...]


def call_key(row: Row) -> Key:
    """The record of its forward call that a recomputed record repeats (and the forward's own)."""
    return (row["rank"], row["step"], row.get("module"), row.get("op"), row.get("call"), row.get("io"),
            row.get("slot"))


def forward_index(rows: Iterable[Row]) -> dict[Key, Row]:
    """The forward records of ``rows`` (one dump's) by :func:`call_key`."""
    return {call_key(row): row for row in rows if row.get("phase") == "forward"}


def remakes(forward: dict[Key, Row], row: Row) -> bool | None:
    """Does recomputed ``row`` hold the bytes its forward call made? None: nothing to hold it
    against (no such forward record, or no hash on either)."""
    made = forward.get(call_key(row))
    if made is None or row.get("hash") is None or made.get("hash") is None:
        return None
    return (made["hash"] == row["hash"] and made.get("numel") == row.get("numel")
            and made.get("dtype") == row.get("dtype"))
