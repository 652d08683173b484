"""The index rows compare holds until its verdict: equal strings are one object, the rows
are the same values, and they take measurably less memory than Arrow's plain rows."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from synth import Run

from opscope.compare.api import _rows
from opscope.storage.reader import load


def _held(make: Callable[[], Any]) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        value = make()
        return value, tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


def _many_ops(path: Path, n: int) -> Any:
    """One step of ``n`` small ops over 8 modules, statistics only (an index and little else)."""
    run = Run(path, data="statistics")
    x = run.leaf(np.ones(4))
    for i in range(n):
        (x,) = run.op("aten.add.Tensor", [x], [x.value + 1], module=f"layers.{i % 8}.mlp")
    run.close()
    return load(path).records(rank=0, step=0)


def test_index_rows_share_their_strings_and_cost_less(tmp_path: Path) -> None:
    table = _many_ops(tmp_path / "d", 300)
    plain, plain_bytes = _held(table.to_pylist)
    rows, rows_bytes = _held(lambda: _rows(table))
    assert rows == plain  # the same values, column by column
    for name in ("phase", "module", "op", "io", "dtype", "device"):
        texts = {row[name] for row in rows if row[name] is not None}
        objects = {id(row[name]) for row in rows if row[name] is not None}
        assert len(objects) == len(texts), name  # one object per distinct string
    # each row repeats ~6 short strings (~55 bytes each) that now exist once
    assert rows_bytes < plain_bytes - 200 * len(rows), (rows_bytes, plain_bytes, len(rows))
