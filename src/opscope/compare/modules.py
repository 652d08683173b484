"""A dump that records no module paths (msprobe at level L1) against one that does.

Calls are grouped by (phase, module) before they are aligned; when one side knows no
modules, both sides are put at the top level, and each call's index is renumbered per
(phase, op) in execution order, so calls pair by API name and call order alone.
"""

from __future__ import annotations

from collections import Counter
from typing import Any


def records_modules(dump: Any) -> bool:
    """False when the dump's manifest says it has no module paths (``"modules": false``)."""
    manifest = getattr(dump, "manifest", None) or {}
    return manifest.get("modules", True) is not False


def flatten_modules(rows: list[dict[str, Any]]) -> None:
    """Put every row at the top level, in place; the module path is kept as ``orig_module``."""
    index: dict[tuple[Any, ...], int] = {}
    per_op: Counter[tuple[Any, Any]] = Counter()
    for row in sorted(rows, key=lambda r: r["seq"]):
        if row.get("call") is not None:
            key = (row.get("phase"), row.get("module"), row.get("op"), row.get("call"))
            if key not in index:
                index[key] = per_op[(row.get("phase"), row.get("op"))]
                per_op[(row.get("phase"), row.get("op"))] += 1
            row["call"] = index[key]
        if row.get("module"):
            row.setdefault("orig_module", row["module"])
        row["module"] = ""
