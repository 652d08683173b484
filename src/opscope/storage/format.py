"""The dump layout and its version. See docs/format.md.

::

    DUMP/
      manifest.json                          format version, versions, host, command, config, status
      rank<R>/rank.json                      this rank's status, steps and counts
      rank<R>/step<S>/records-<N>.parquet    index rows (pyarrow, pandas, polars, duckdb)
      rank<R>/records-<first>-<last>-<N>.parquet  index rows of several small steps (format 2.0),
                                             which it lists in its metadata (3.0: they have no folder)
      rank<R>/step<S>/tensors-<N>.safetensors  full tensors (data="tensor"), keyed "r<id>"
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pyarrow as pa

from opscope.model.hashing import ALGORITHM
from opscope.model.records import SCHEMA_FIELDS

# 1.1: the `view` column; 2.0: small steps' rows together in the rank's folder (a 1.x reader would miss them);
# 3.0: such steps listed in their file's metadata, without a folder of their own (a 2.x reader would miss them)
FORMAT_VERSION = "3.0"
MANIFEST = "manifest.json"
RANK_STATUS = "rank.json"
HASH_ALGORITHM = ALGORITHM  # "wsum64-v2": opscope.model.hashing, docs/format.md
# How the statistics' std was taken (manifest "std"): "deviations", each tensor's own to ~1e-6
# (docs/format.md, Statistics; since 8 December 2026). Absent in older dumps and peers' ones,
# whose std may carry the rounding of float32 sums of squares.
STD_METHOD = "deviations"

_TYPES = {
    "int64": pa.int64(),
    "int32": pa.int32(),
    "uint64": pa.uint64(),
    "float64": pa.float64(),
    "string": pa.string(),
    "list<int64>": pa.list_(pa.int64()),
}
SCHEMA = pa.schema([pa.field(name, _TYPES[kind]) for name, kind in SCHEMA_FIELDS])


def rank_dir(root: str | os.PathLike, rank: int) -> Path:
    return Path(root) / f"rank{int(rank)}"


def step_dir(root: str | os.PathLike, rank: int, step: int) -> Path:
    return rank_dir(root, rank) / f"step{int(step)}"


BATCH_FILE = re.compile(r"records-(\d+)-(\d+)-(\d+)\.parquet")  # in a rank's folder: steps first..last


# Index files written without Parquet dictionaries or column statistics: the reader uses neither
# (a TensorFlow step of 2,905 rows: 4.7 -> 3.3 ms of the writer's CPU, 93 -> 78 kB; a batch file of
# 500 tiny steps: ~180 -> ~95 us a step, 5.0 -> 4.1 kB a step). Batch files and TensorFlow's tables.
LEAN_PARQUET = {"use_dictionary": False, "write_statistics": False}
BATCH_STEPS = "opscope.steps"  # a batch file's key-value metadata: its steps, as step_runs writes them


def batch_name(first: int, last: int, index: int) -> str:
    """The name of a rank's ``index``-th file of several steps' rows, ``first`` to ``last``."""
    return f"records-{int(first)}-{int(last)}-{int(index):05d}.parquet"


def step_runs(steps: list[int]) -> str:
    """``steps`` as JSON runs of consecutive steps, ``[[first, last], ...]``, ascending."""
    runs: list[list[int]] = []
    for step in sorted(set(steps)):
        if runs and step == runs[-1][1] + 1:
            runs[-1][1] = int(step)
        else:
            runs.append([int(step), int(step)])
    return json.dumps(runs, separators=(",", ":"))


def steps_of_runs(text: str | bytes) -> list[int]:
    """The steps of :func:`step_runs`' text."""
    return [step for first, last in json.loads(text) for step in range(int(first), int(last) + 1)]


def write_json(path: str | os.PathLike, data: Any, indent: int | None = 1) -> None:
    """Write JSON atomically: a reader sees the old file or the new one, never half of one.
    ``indent=None`` writes one line through json's C encoder (an indented list of 100,000
    steps takes ~40 ms in its Python encoder, ~13 ms so)."""
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=indent, default=str)
        f.write("\n")
    os.replace(tmp, path)


def major(version: str) -> int:
    return int(str(version).split(".", 1)[0])
