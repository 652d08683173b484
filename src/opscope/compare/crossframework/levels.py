"""Which dumps need the cross-framework alignment: the capture level of each side."""

from __future__ import annotations

from typing import Any

from opscope.compare.crossframework.tables import table_for

TORCH_LEVELS = ("aten", "api", "module")


def dump_level(dump: Any) -> str | None:
    """The capture level of a dump: ``onnx``, ``aten``, ``api``, ``module``, or None."""
    manifest = getattr(dump, "manifest", None) or {}
    level = manifest.get("level") or (manifest.get("config") or {}).get("level")
    return str(level) if level else None


def is_cross(t_level: str | None, r_level: str | None) -> bool:
    """True when a side is a dump of a framework with an op table (an ONNX Runtime dump):
    align with :func:`~opscope.compare.crossframework.align_partition`. A layer-level dump
    (Keras) goes there against a torch module dump only: two Keras dumps pair by layer path,
    as two torch module dumps do, and against op-level dumps they name things differently."""
    table = table_for(t_level) or table_for(r_level)
    if table is not None and table.layers:  # layers pair with torch modules only
        return (r_level if table_for(t_level) is table else t_level) == "module"
    return table is not None


def manifest_warnings(dump: Any, side: str) -> list[str]:
    """The manifest's ``warnings`` (e.g. an fp16 capture that changed what ORT computes)."""
    manifest = getattr(dump, "manifest", None) or {}
    return [f"{side} {dump.path}: {w}" for w in manifest.get("warnings") or []]


def level_mismatch(t_dump: Any, r_dump: Any) -> list[str]:
    """A sentence when the two dumps name their ops in different vocabularies that no op table
    bridges (a MindSpore dump against a PyTorch one): their ops will not pair by name."""
    t_level, r_level = dump_level(t_dump), dump_level(r_dump)
    if t_level == r_level or is_cross(t_level, r_level) or (t_level in TORCH_LEVELS and r_level in TORCH_LEVELS):
        return []
    return [f"the target's ops are named at level {t_level or 'unknown'!r} and the reference's at level "
            f"{r_level or 'unknown'!r}: ops pair by name, and these two name them differently; compare two dumps "
            "of one framework (or give a mapping file renaming the target's ops and modules)"]
