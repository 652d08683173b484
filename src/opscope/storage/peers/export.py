"""A peer dump (msprobe, MindSpore) written out in opscope's own format, so repeated compares
read Parquet and safetensors instead of the tool's JSON and per-tensor files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from opscope.errors import DumpFormatError, OpscopeError
from opscope.storage import format as fmt
from opscope.storage.reader import Dump
from opscope.storage.safetensors_io import DTYPES, write_shard

RECORDS = "records-0.parquet"
TENSORS = "tensors-0.safetensors"


def write_opscope(dump: Dump, out: Path) -> tuple[int, int]:
    """Write ``dump`` as an opscope dump at ``out`` (which must be new or empty).

    Records keep every column; full tensors (where the peer dump holds them) go to one
    safetensors shard per step, keyed ``r<id>``. The manifest keeps the peer's ``tool``,
    ``level`` and ``hash_algorithm`` (so its hashes stay trusted only against the same
    tool's), and adds ``converted_from``.

    Returns:
        (records, tensors) written.

    Raises:
        OpscopeError: ``out`` is not empty, or a tensor of the dump is unreadable.
    """
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OpscopeError(f"{out} exists and is not empty: give a new directory for the converted dump")
    out.mkdir(parents=True, exist_ok=True)
    n_records = n_tensors = 0
    steps: dict[int, list[int]] = {}
    for rank, step in dump.partitions():
        table = dump.records(rank=rank, step=step)
        step_dir = fmt.step_dir(out, rank, step)
        step_dir.mkdir(parents=True, exist_ok=True)
        table, written = _move_tensors(dump, table, rank, step, step_dir)
        pq.write_table(table, step_dir / RECORDS)
        n_records += table.num_rows
        n_tensors += written
        steps.setdefault(rank, []).append(step)
    for rank, done in steps.items():
        fmt.write_json(fmt.rank_dir(out, rank) / fmt.RANK_STATUS,
                       {"rank": rank, "status": "complete", "steps": sorted(done)})
    manifest = {**dump.manifest, "format_version": fmt.FORMAT_VERSION, "status": "complete",
                "converted_from": str(dump.path), "ranks": sorted(steps)}
    fmt.write_json(out / fmt.MANIFEST, manifest)
    return n_records, n_tensors


def _move_tensors(dump: Dump, table: pa.Table, rank: int, step: int, step_dir: Path) -> tuple[pa.Table, int]:
    """Copy the step's tensors into one shard; the rows then point at it."""
    rows = table.to_pylist()
    entries: list[tuple[str, str, list[int], np.ndarray]] = []
    for row in rows:
        if not row.get("data") or not row.get("key"):
            continue
        try:
            arr = dump.tensor(rank, step, row["data"], row["key"], raw=True)
        except DumpFormatError as exc:
            raise OpscopeError(f"cannot convert record {row['id']} ({row.get('op')} {row.get('io')} "
                               f"{row.get('slot')}): {exc}") from None
        dtype = str(row.get("dtype"))
        if dtype not in DTYPES:
            dtype = str(arr.dtype)
        entries.append((f"r{int(row['id'])}", dtype, list(arr.shape), np.ascontiguousarray(arr)))
        row["data"], row["key"], row["view"] = TENSORS, f"r{int(row['id'])}", None
    if entries:
        write_shard(step_dir / TENSORS, entries)
    return pa.Table.from_pylist(rows, schema=fmt.SCHEMA), len(entries)
