"""The monitor's files: a Parquet time series per rank, written crash-safely, and its reader.

Layout (docs/monitor.md)::

    PATH/monitor.json                 format, config, the command (written at start)
    PATH/rank<R>/index.json           chunks written so far, series order, status
    PATH/rank<R>/series-<first step>.parquet   rows: step, kind, name, stat, value
    PATH/rank<R>/events.jsonl         one event per line, flushed as found
    PATH/report.html                  rank 0's report (other ranks: PATH/rank<R>/report.html)

Rows are one per step x tensor x statistic. Every ``chunk`` steps the rows held in memory
go to a new Parquet file (on a background thread), written under a temporary name and
renamed when complete, then ``index.json`` is replaced the same way: a crash loses at most the steps since the last
chunk, and every file on disk is whole. File names hold step numbers only, never a
tensor's name.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from opscope.errors import DumpExistsError, DumpFormatError, DumpWriteError
from opscope.monitor.events import STATS, MonitorData, MonitorEvent, RankSeries
from opscope.monitor.registry import SeriesTable

FORMAT = "opscope-monitor/1"
Block = tuple[np.ndarray, np.ndarray]  # a step's tensors of one kind: series ids, [n, 4] statistics


def as_array(values: np.ndarray | bytearray) -> np.ndarray:
    """A block's statistics as a ``[n, 4]`` array: the training thread hands the gradients' over
    as the batched kernel wrote them, float64 bytes (``stats.Running``), and the judge's
    thread makes them an array."""
    return values if isinstance(values, np.ndarray) else np.frombuffer(values, np.float64).reshape(-1, 4)


def _replace_json(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"  # every rank writes monitor.json: its own temp file
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(data, indent=1, allow_nan=False, default=str))
    os.replace(tmp, path)


class SeriesWriter:
    """Appends one rank's rows; see the module docstring for what is on disk when. ``series``
    names the ids of the rows (resolved when a chunk is written)."""

    def __init__(self, path: str, rank: int, chunk: int, config: dict[str, Any], overwrite: bool,
                 series: SeriesTable | None = None) -> None:
        self.series = series if series is not None else SeriesTable()
        self._root = str(path)  # (strings: a Path held costs ~400 B with its parts)
        self._dir = os.path.join(self._root, f"rank{rank}")
        # the files by os.path: pathlib interns each name it parses (held for good: a chunk's name each)
        if os.path.exists(os.path.join(self._dir, "index.json")) and not overwrite:
            raise DumpExistsError(f"{self.dir} holds a monitor run already; pass overwrite=True (or \"overwrite\": "
                                  "true in the monitor section) or another path")
        self.dir.mkdir(parents=True, exist_ok=True)
        for old in self.dir.glob("series-*.parquet"):
            old.unlink()
        with open(os.path.join(self._dir, "events.jsonl"), "w", encoding="utf-8"):
            pass
        self.rank, self.chunk = rank, chunk
        _warm_pyarrow()
        self.held: list[tuple[int, list[Block], dict[int, float]]] = []
        self.chunks: list[str] = []
        self.first_step: int | None = None
        self.steps_held = 0
        self.last_step = -1
        if rank == 0 or not os.path.exists(os.path.join(self._root, "monitor.json")):
            _replace_json(os.path.join(self._root, "monitor.json"), {"format": FORMAT, "config": config})
        self._writing: threading.Thread | None = None
        self.error: BaseException | None = None
        self._index("running", 0, 0)

    @property
    def root(self) -> Path:
        """The monitor's folder."""
        return Path(self._root)

    @property
    def dir(self) -> Path:
        """This rank's folder in it."""
        return Path(self._dir)

    def add(self, step: int, blocks: list[Block], scalars: dict[int, float]) -> None:
        """One finished step: blocks of tensors (their series ids and ``[n, 4]`` statistics, in
        :data:`~opscope.monitor.stats.STATS` order) and scalars by id (the loss, learning rates)."""
        if self.first_step is None:
            self.first_step = step
        self.held.append((step, blocks, scalars))
        self.steps_held += 1
        self.last_step = step
        if self.steps_held >= self.chunk:
            self.flush()
        elif self.error is not None:
            self.wait()

    def event(self, event: MonitorEvent) -> None:
        """Append one event to ``events.jsonl`` (flushed at once)."""
        with open(os.path.join(self._dir, "events.jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps(event.to_json(), allow_nan=False) + "\n")

    def flush(self, wait: bool = False) -> None:
        """Write the rows held as one Parquet chunk, then the index, on a background thread
        (the training thread only hands the steps over); ``wait`` for it to finish."""
        self.wait()
        if self.held:
            held, name = self.held, f"series-{self.first_step:09d}.parquet"
            self.held, self.first_step, self.steps_held = [], None, 0
            known, steps = len(self.series), self.last_step + 1
            self._writing = threading.Thread(target=self._write, args=(held, name, known, steps),
                                             name="opscope-monitor-writer", daemon=True)
            self._writing.start()
        if wait:
            self.wait()

    def wait(self) -> None:
        """Wait for the chunk being written; raise its error, if it failed."""
        if self._writing is not None:
            self._writing.join()
            self._writing = None
        if self.error is not None:
            error, self.error = self.error, None
            raise DumpWriteError(f"monitor: could not write {self.dir}: {error}") from error

    def _write(self, held: list[Any], name: str, known: int, steps: int) -> None:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq

            step, ids, stat, value = _columns(held)
            kind_of = np.frombuffer(self.series.kind_of[:known], dtype=np.uint8)
            # kind, name and stat from codes into the series' few strings: no Python string per row
            table = pa.table({"step": pa.array(step, pa.int64()),
                              "kind": _coded(kind_of[ids], list(self.series.kinds)),
                              "name": _coded(ids, self.series.names[:known]).dictionary_decode(),
                              "stat": _coded(stat, [*STATS, "value"]),
                              "value": pa.array(value, pa.float64())})
            tmp = os.path.join(self._dir, name + ".tmp")
            pq.write_table(table, tmp)
            os.replace(tmp, os.path.join(self._dir, name))
            self.chunks.append(name)
            self._index("running", known, steps)
        except Exception as exc:  # a full disk, a removed folder: raised on the training thread
            self.error = exc

    def close(self, status: str) -> None:
        self.flush(wait=True)
        self._index(status, len(self.series), self.last_step + 1)

    def _index(self, status: str, known: int, steps: int) -> None:
        """index.json, with the places of the first ``known`` series."""
        _replace_json(os.path.join(self._dir, "index.json"),
                      {"format": FORMAT, "rank": self.rank, "status": status, "chunks": list(self.chunks),
                       "order": self.series.places(known), "steps": steps})


def _warm_pyarrow() -> None:
    """Import pyarrow's Parquet writer and convert one array now: pyarrow's first conversion
    imports pandas (about a second), which is not to be paid at the first chunk, mid-run."""
    import pyarrow.parquet  # noqa: F401

    from opscope.storage.arrow_build import convert_ready

    convert_ready()


def _columns(held: list[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The held steps as rows, one per step x tensor x statistic, then one per scalar, in
    columns: step, series id, statistic (its index in STATS; len(STATS): a scalar's value),
    value. A few numpy calls per chunk: per block of a step only its arrays are listed."""
    ids: list[np.ndarray] = []
    values: list[np.ndarray] = []
    widths: list[int] = []  # rows per series of each block: len(STATS), or 1 for the scalars
    steps: list[int] = []
    for step, blocks, scalars in held:
        for block_ids, stats in blocks:
            ids.append(block_ids)
            values.append(stats.reshape(-1))
            widths.append(len(STATS))
            steps.append(step)
        if scalars:
            ids.append(np.fromiter(scalars, np.int64, len(scalars)))
            values.append(np.fromiter(scalars.values(), np.float64, len(scalars)))
            widths.append(1)
            steps.append(step)
    if not ids:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    counts = [len(i) for i in ids]
    rows = np.repeat(np.array(widths, dtype=np.int64), counts)  # rows of each series
    first = np.repeat(np.cumsum(rows) - rows, rows)  # each row's series' first row
    stat = np.arange(int(rows.sum())) - first
    stat[np.repeat(rows == 1, rows)] = len(STATS)
    step_rows = np.repeat(np.repeat(np.array(steps, dtype=np.int64), counts), rows)
    return step_rows, np.repeat(np.concatenate(ids).astype(np.int64), rows), stat, np.concatenate(values)


def _coded(codes: np.ndarray, strings: list[str]) -> Any:
    """A Parquet dictionary column: row i is ``strings[codes[i]]``."""
    import pyarrow as pa

    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32)), pa.array(strings, pa.string()))


def read(path: str | os.PathLike) -> MonitorData:
    """Read a monitor folder (also one left by a crashed run: every whole chunk is read).

    Raises:
        DumpFormatError: ``path`` is not a monitor folder, or was written by a newer format.
    """
    root = Path(path)
    meta_path = root / "monitor.json"
    if not meta_path.is_file():
        raise DumpFormatError(f"{root} is not a monitor folder (no monitor.json); give the path passed to "
                              "opscope.monitor(path) or the monitor section's \"path\"")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if str(meta.get("format", "")).split("/")[0] != "opscope-monitor" or meta.get("format") != FORMAT:
        raise DumpFormatError(f"{meta_path}: format {meta.get('format')!r} is not {FORMAT!r}; upgrade opscope")
    ranks = {}
    for rank_dir in sorted(root.glob("rank*")):
        if rank_dir.is_dir() and rank_dir.name[4:].isdigit():
            ranks[int(rank_dir.name[4:])] = _read_rank(rank_dir, int(rank_dir.name[4:]))
    return MonitorData(path=str(root), config=meta.get("config", {}), ranks=ranks)


def _read_rank(folder: Path, rank: int) -> RankSeries:
    import pyarrow.parquet as pq

    try:
        index = json.loads((folder / "index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        index = {"status": "crashed", "order": {}}
    values: dict[tuple[str, str, str], tuple[list[int], list[float]]] = {}
    last = -1
    # every whole chunk, also those written after the index was last replaced
    for chunk in sorted(folder.glob("series-*.parquet")):
        table = pq.read_table(chunk).to_pydict()
        for step, kind, name, stat, value in zip(table["step"], table["kind"], table["name"], table["stat"],
                                                 table["value"], strict=True):
            steps, vals = values.setdefault((kind, name, stat), ([], []))
            steps.append(step)
            vals.append(value)
            last = max(last, step)
    order = {}
    for key, position in index.get("order", {}).items():
        kind, _, name = key.partition("\t")
        order[(kind, name)] = int(position)
    return RankSeries(rank=rank, values=values, order=order, events=_read_events(folder / "events.jsonl"),
                      status=str(index.get("status", "crashed")), steps=last + 1)


def _read_events(path: Path) -> list[MonitorEvent]:
    events: list[MonitorEvent] = []
    if not path.is_file():
        return events
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            events.append(MonitorEvent.from_json(json.loads(line)))
        except (ValueError, KeyError, TypeError):  # a line cut by a crash
            continue
    return events
