"""Per-framework op tables: how another framework's ops map onto torch's.

Cross-framework alignment (:mod:`opscope.compare.crossframework`) knows nothing about any
framework but torch. Everything it needs to know about the other side is an
:class:`OpTable`, registered for the capture level its dumps carry in their manifest
(``level: "onnx"``). A side whose level has a table is a *foreign* side; a dump whose level
has none (``aten``, ``api``, ``module``) is a torch dump.

Adding a framework means adding a table, not editing the aligner::

    # opscope/compare/crossframework/tables/tensorflow.py
    from opscope.compare.crossframework.tables.table import OpTable

    TENSORFLOW = OpTable(
        framework="tf",                       # the manifest's level of a TensorFlow dump
        to_torch={"MatMul": frozenset({"aten.mm", "aten.matmul"}), ...},
        decompositions={...}, fusions={"_FusedMatMul": frozenset({"aten.addmm", "aten.relu"})},
        folded={...}, internal=frozenset({"Const", "Shape"}), order_preserving=frozenset({"Reshape"}),
        movement=frozenset({"Reshape", "Transpose"}),
        key=lambda op: op.removeprefix("tf::"), op_type=lambda op: op.rpartition("::")[2],
    )

and its name in :data:`BUILT_IN` below (or :func:`register_table` from outside opscope). A dump written by
another tool (msprobe, MindSpore) needs a reader that turns it into opscope records
(:mod:`opscope.storage`) with its own level, and a table for that level.
"""

from __future__ import annotations

from opscope.compare.crossframework.tables.keras import KERAS
from opscope.compare.crossframework.tables.onnx import ONNX
from opscope.compare.crossframework.tables.table import OpTable

BUILT_IN: tuple[OpTable, ...] = (ONNX, KERAS)

_TABLES: dict[str, OpTable] = {t.framework: t for t in BUILT_IN}


def register_table(table: OpTable) -> OpTable:
    """Make ``table`` the one for dumps of its level; refuses a second table for a level."""
    if table.framework in _TABLES:
        raise ValueError(f"an op table for {table.framework!r} dumps is already registered")
    _TABLES[table.framework] = table
    return table


def table_for(level: str | None) -> OpTable | None:
    """The table of dumps of capture level ``level``; None for a torch dump (or an unknown level)."""
    return _TABLES.get(level) if level else None


__all__ = ["BUILT_IN", "OpTable", "register_table", "table_for"]
