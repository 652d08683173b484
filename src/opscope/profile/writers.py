"""Profile files, each written atomically (temporary name, then rename).

Per rank (``OUT/rank<R>/``): ``steps.parquet``, ``steps.csv``, ``ops.parquet``, ``ops.csv``,
``trace.json.gz``, ``summary.json``. Merged (``OUT/``): the same names over every rank,
plus ``report.html``. ``summary.json`` is written first with ``"status": "running"`` and
last with the final status, so a run that died says so.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from opscope.errors import ProfileError
from opscope.profile.model import OP_COLUMNS, STEP_COLUMNS, OpRow, StepRow
from opscope.profile.summary import aggregate_ops

OPS_CSV_COLUMNS = ("name", "shapes", "calls", "total_us", "self_us", "device_us", "steps", "self_us_per_step", "phase")
RANK_FILES = ("steps.parquet", "steps.csv", "ops.parquet", "ops.csv", "trace.json.gz", "summary.json")
TOP_FILES = (*RANK_FILES, "report.html")


def atomic_write(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ProfileError(f"could not write {path}: {exc.strerror or exc}; check free space and permissions") from exc
    return path


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """``obj`` as indented JSON."""
    return atomic_write(path, json.dumps(obj, indent=2, default=str) + "\n")


def _csv_text(columns: Sequence[str], rows: Iterable[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _step_schema() -> Any:
    import pyarrow as pa

    fields = [(c, pa.bool_() if c in ("task_trace", "complete") else pa.int64()) for c in STEP_COLUMNS]
    return pa.schema(fields)


def _op_schema() -> Any:
    import pyarrow as pa

    types = {"rank": pa.int64(), "step": pa.int64(), "calls": pa.int64(), "phase": pa.string(), "name": pa.string(),
             "shapes": pa.string()}
    return pa.schema([(c, types.get(c, pa.float64())) for c in OP_COLUMNS])


def _parquet(path: Path, rows: list[dict[str, Any]], schema: Any) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(rows, schema=schema)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return atomic_write(path, sink.getvalue().to_pybytes())


def write_steps(folder: Path, steps: Sequence[StepRow]) -> list[Path]:
    """``steps.parquet`` and ``steps.csv`` (same columns, integer nanoseconds)."""
    rows = [s.to_row() for s in steps]
    return [_parquet(folder / "steps.parquet", rows, _step_schema()),
            atomic_write(folder / "steps.csv", _csv_text(STEP_COLUMNS, rows))]


def write_ops(folder: Path, ops: Sequence[OpRow]) -> list[Path]:
    """``ops.parquet`` (per step and phase) and ``ops.csv`` (totals, largest self time first)."""
    rows = [o.to_row() for o in ops]
    return [
        _parquet(folder / "ops.parquet", rows, _op_schema()),
        atomic_write(folder / "ops.csv", _csv_text(OPS_CSV_COLUMNS, aggregate_ops(ops))),
    ]


def read_steps(path: Path) -> list[StepRow]:
    """Rows of a ``steps.parquet``."""
    import pyarrow.parquet as pq

    return [StepRow.from_row(r) for r in pq.read_table(path).to_pylist()]


def read_ops(path: Path) -> list[OpRow]:
    """Rows of an ``ops.parquet``."""
    import pyarrow.parquet as pq

    return [OpRow(**r) for r in pq.read_table(path).to_pylist()]


def clear(folder: Path, names: Iterable[str]) -> None:
    """Remove opscope's own files (and their leftovers) from ``folder``, nothing else."""
    for name in names:
        for candidate in (folder / name, folder / f"{name}.partial"):
            candidate.unlink(missing_ok=True)
