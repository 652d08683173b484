"""Streaming, crash-safe dump writer.

The capture thread hands rows and tensor buffers to :class:`DumpWriter`; a background
thread writes them. The queue is bounded in bytes (``queue_limit``): when full, the
capture thread waits (back-pressure) instead of memory growing. Every file is written
under a temporary name and renamed when complete, so a killed process leaves only whole
shards. A write error (disk full, permissions) is raised on the capture thread at its
next call, as :class:`~opscope.errors.DumpWriteError`, and never hangs it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from opscope.errors import DumpWriteError
from opscope.storage import dump_root
from opscope.storage import format as fmt
from opscope.storage.arrow_build import POOL
from opscope.storage.safetensors_io import write_chunks, write_shard
from opscope.storage.table import rows_to_table

_STOP = object()
STATUS_EVERY = 1.0  # seconds between rank.json updates while the dump runs (and at its end)
WAKE_BYTES = 1 << 20  # a queued item this large wakes the writer thread; smaller ones wait for its next round
WAKE_EVERY = 0.25  # seconds between the starts of two rounds of the writer thread unless something large wakes it
COMPRESS_ROWS = 1024  # index files of fewer rows are written uncompressed
BATCH_STEP_ROWS = 4096  # with ``batch``: a step's index of fewer rows is written with the round's other small steps
BATCH_ROWS = 1 << 16  # rows of one batch file at most
WAIT_NOTE_S = 1.0  # the dump's notes say how long the caller waited for the disk from this long on
# step -> (open shard's name, its (key, dtype, shape, buffer) chunks)
OpenShards = dict[int, tuple[str, list[tuple[str, str, list[int], Any]]]]


class DumpWriter:
    """Writes one rank's part of a dump under ``root``.

    Args:
        root: the dump directory.
        rank: this process's rank.
        manifest: common manifest fields (versions, host, command, config, ...).
        queue_limit: bytes of pending rows and tensors before the caller waits.
        shard_bytes: tensor bytes per safetensors shard.
        overwrite: replace an existing dump at ``root``.
        batch: write the index rows of small steps (under :data:`BATCH_STEP_ROWS` rows) queued
            in one round of the writer thread together, as one file in the rank's folder
            (``rank<R>/records-<first>-<last>-<N>.parquet``, docs/format.md), instead of one
            file per step: a Parquet file costs about a millisecond whatever its size.
    """

    def __init__(self, root: str | os.PathLike, rank: int, manifest: dict[str, Any], *,
                 queue_limit: int = 512 << 20, shard_bytes: int = 256 << 20, overwrite: bool = False,
                 batch: bool = False) -> None:
        self.root = Path(root)
        self.rank = rank
        self.manifest = dict(manifest)
        self.queue_limit = queue_limit
        self.shard_bytes = shard_bytes
        self.overwrite = overwrite
        self.error: DumpWriteError | None = None
        self.steps: list[int] = []
        self._steps_seen: set[int] = set()
        self.records = 0
        self.tensor_bytes = 0
        self.write_seconds = 0.0  # the writer thread's time in writes (files, rank.json), since open
        self.waited_seconds = 0.0  # the caller's time waiting for room in the queue (the disk behind)
        self._queue: deque[tuple[Any, ...]] = deque()
        self._pending = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._shard: dict[int, tuple[int, int]] = {}  # step -> (index, bytes) on the caller side
        self._rows_index: dict[int, int] = {}
        self._status_at = 0.0  # when rank.json was last written (writer thread)
        self.batch = batch
        self._batches = 0  # batch files written (writer thread)
        self._urgent = False  # something large or the stop is queued: the next round starts now
        self._manifest_lock = threading.Lock()  # the writer thread writes it every second

    # -- caller side -------------------------------------------------------------------
    @contextlib.contextmanager
    def editing_manifest(self) -> Iterator[dict[str, Any]]:
        """The manifest, to change from the caller's thread while the writer thread runs: it
        writes the manifest with the status every second, and a dict that changes size while
        json encodes it fails the dump (a session's notes added at its end did, once)."""
        with self._manifest_lock:
            yield self.manifest

    def open(self) -> None:
        """Create the layout, refuse to mix runs, start the writer thread."""
        dump_root.prepare(self.root, self.rank, self.manifest.get("run_id"), self.overwrite)
        self.manifest.update(status="running", started=_now(), format_version=fmt.FORMAT_VERSION)
        self._write_status("running")
        # imported now, not by the thread's first round: that import held the GIL ~30-100 ms
        # in the middle of the run, the training thread waiting for it
        import pyarrow.parquet  # noqa: F401

        self._thread = threading.Thread(target=self._loop, name="opscope-writer", daemon=True)
        self._thread.start()

    def add_tensor(self, step: int, key: str, dtype: str, shape: list[int], buffer: Any, nbytes: int) -> str:
        """Queue one tensor; returns the shard file name (relative to the step directory)."""
        index, size = self._shard.get(step, (0, 0))
        if size and size + nbytes > self.shard_bytes:
            index, size = index + 1, 0
        self._shard[step] = (index, size + nbytes)
        name = f"tensors-{index:05d}.safetensors"
        self._put(("tensor", step, name, key, dtype, shape, buffer), nbytes)
        return name

    def add_shard(self, step: int, chunks: list[Any], size: int, nbytes: int) -> str:
        """Queue a whole tensor shard built by the caller (the native dump copies tensors into
        it at the op): the file is ``chunks`` (buffers) one after the other, cut to ``size``
        bytes (see :func:`write_chunks`), ``nbytes`` of them tensor data. Returns its file name."""
        index, used = self._shard.get(step, (0, 0))
        if used:
            index += 1  # add_tensor's shard of this step stays its own
        self._shard[step] = (index + 1, 0)
        name = f"tensors-{index:05d}.safetensors"
        self._put(("shard", step, name, chunks, size, nbytes), size)
        return name

    def add_rows(self, step: int, rows: list[list[Any]]) -> None:
        """Queue index rows of one step (written as one Parquet shard)."""
        if rows:
            index = self._rows_index.get(step, 0)
            self._rows_index[step] = index + 1
            self._put(("rows", step, f"records-{index:05d}.parquet", rows), 200 * len(rows))

    def add_table(self, step: int, table: Any) -> None:
        """Queue index rows of one step as an Arrow table in :data:`SCHEMA` order, or as an
        object with ``num_rows`` whose ``table()`` builds one (called on the writer thread:
        the native capture hands its columns over unconverted). Such an object may carry
        ``parquet_options``, keywords for ``pyarrow.parquet.write_table`` (``use_dictionary``...),
        and ``batch_options = True`` where a batch file of several steps may take them (``batch``)."""
        if table.num_rows:
            index = self._rows_index.get(step, 0)
            self._rows_index[step] = index + 1
            self._put(("rows", step, f"records-{index:05d}.parquet", table), 200 * table.num_rows)

    def end_step(self, step: int) -> None:
        """Mark a step complete: its open tensor shard is closed and rank.json updated."""
        self._put(("end_step", step), 0)

    def close(self, status: str = "complete", error: str | None = None) -> None:
        """Drain the queue, stop the thread, and record the final status."""
        if self._thread is not None:
            with self._cond:
                self._queue.append((_STOP,))
                self._urgent = True
                self._cond.notify_all()
            self._thread.join()
            self._thread = None
        if self.error is not None and status == "complete":
            status, error = "crashed", str(self.error)
        self.manifest["ended"] = _now()
        # On a failed disk the status may not be writable; the shards already written stay readable.
        with contextlib.suppress(OSError):
            self._write_status(status, error)

    def wait_note(self) -> str | None:
        """A sentence for the dump's notes when the caller waited :data:`WAIT_NOTE_S` or more
        for room in the queue (the disk behind the steps), with what shortens the wait."""
        if self.waited_seconds <= 0 or self.waited_seconds < WAIT_NOTE_S:
            return None
        return (f"the training thread waited {self.waited_seconds:.1f} s for the disk: the writer fell behind "
                f"the steps (its queue holds {self.queue_limit >> 20} MB of tensors, queue_limit_mb); a faster "
                "disk for the dump, fewer steps or tensor_ops (only the named ops' tensors) make the wait shorter")

    def check(self) -> None:
        """Raise the writer thread's error, if any, on the caller's thread."""
        if self.error is not None:
            raise self.error

    def _put(self, item: tuple[Any, ...], nbytes: int) -> None:
        """Queue ``item``. Small items (a step's rows, its end) do not wake the writer thread,
        which takes them on its next round (:data:`WAKE_EVERY`): one hand-over of the GIL per
        round instead of one per item, which a training step of a millisecond would feel."""
        self.check()
        with self._cond:
            if self._pending and self._pending + nbytes > self.queue_limit:
                start = time.perf_counter()
                while self._pending and self._pending + nbytes > self.queue_limit and self.error is None:
                    self._urgent = True
                    self._cond.notify_all()
                    self._cond.wait(0.5)
                self.waited_seconds += time.perf_counter() - start
            self.check()
            self._pending += nbytes
            self._queue.append((*item, nbytes))
            if nbytes >= WAKE_BYTES or self._pending + WAKE_BYTES > self.queue_limit:
                self._urgent = True
                self._cond.notify_all()

    # -- writer thread -----------------------------------------------------------------
    def _loop(self) -> None:
        """Rounds start :data:`WAKE_EVERY` apart unless something large (or the stop) is queued:
        one started as soon as the last ended took the few steps queued meanwhile (tiny steps
        dumped every step: ~14 a file, ~330 us of the writer's CPU a step for the table, as much
        for the file)."""
        open_shards: OpenShards = {}
        due = time.monotonic()  # the next round's earliest start
        while True:
            with self._cond:
                while not (self._queue and (self._urgent or time.monotonic() >= due)):
                    wait = due - time.monotonic()
                    self._cond.wait(wait if wait > 0 and self._queue else WAKE_EVERY)
                items, self._queue = self._queue, deque()
                self._urgent = False
            due = time.monotonic() + WAKE_EVERY
            if not self._round(items, open_shards):
                return

    def _round(self, items: deque[tuple[Any, ...]], open_shards: OpenShards) -> bool:
        """Write what one round took from the queue; False at the end (stop)."""
        batch: list[tuple[Any, ...]] = []  # small steps' rows, written together (``batch``)
        rows = 0
        while items:
            item = items.popleft()
            if item[0] is _STOP:
                self._flush_batch(batch)
                if self.error is None:
                    self._guard(self._close_shards, open_shards, None)
                return False
            kind = item[0]
            if kind == "end_step":  # (0 bytes: nothing to give back)
                self._end_step(item[1], open_shards)
                continue
            n = _batched(item[3]) if self.batch and kind == "rows" and self.error is None else 0
            if n:
                batch.append(item)
                rows += n
                if rows >= BATCH_ROWS:
                    self._flush_batch(batch)
                    rows = 0
                continue
            if self.error is None:
                self._guard(self._handle, item, open_shards)
            self._done(item[-1])
            del item  # its buffers go now (a native shard's memory back to its pool), not at the next item
        self._flush_batch(batch)
        now = time.monotonic()
        if self.steps and now - self._status_at >= STATUS_EVERY and self.error is None:
            self._status_at = now  # the step directories say which steps are complete
            self._guard(self._write_status, "running")
        return True

    def _done(self, nbytes: int) -> None:
        if not nbytes:  # (a step's end: nothing to give back, no lock to take)
            return
        with self._cond:
            self._pending -= nbytes
            self._cond.notify_all()

    def _flush_batch(self, batch: list[tuple[Any, ...]]) -> None:
        if batch:
            if self.error is None:
                self._guard(self._write_batch, [(item[1], item[3]) for item in batch])
            self._done(sum(item[-1] for item in batch))
            batch.clear()

    def _write_batch(self, parts: list[tuple[int, Any]]) -> None:
        """Several steps' rows as one file in the rank's folder, its steps listed in its metadata
        (format 3.0: a step without files of its own has no folder, which cost ~50-130 us a step)."""
        import pyarrow.parquet as pq

        steps = [step for step, _ in parts]
        payloads = [rows for _, rows in parts]
        combine = getattr(type(payloads[0]), "batch_table", None)
        if combine is not None and all(type(p) is type(payloads[0]) for p in payloads):
            table = combine(payloads)  # the native capture's columns: one table for them all
        else:
            table = pa.concat_tables([_table_of(p) for p in payloads])
        rdir = fmt.rank_dir(self.root, self.rank)
        name = fmt.batch_name(min(steps), max(steps), self._batches)
        self._batches += 1
        tmp = rdir / f"{name}.tmp"
        options = _batch_options(payloads) or fmt.LEAN_PARQUET  # the parts give none
        with pq.ParquetWriter(tmp, table.schema, compression="zstd" if table.num_rows >= COMPRESS_ROWS else "none",
                              memory_pool=POOL, **options) as out:
            out.write_table(table)
            out.add_key_value_metadata({fmt.BATCH_STEPS: fmt.step_runs(steps)})
        os.replace(tmp, rdir / name)
        self.records += table.num_rows

    def _guard(self, fn: Any, *args: Any) -> None:
        start = time.perf_counter()
        try:
            fn(*args)
        except OSError as exc:
            self.error = dump_root.write_error(exc, self.root)
        except Exception as exc:  # keep the caller from waiting forever on a dead thread
            self.error = DumpWriteError(f"dump writer failed: {type(exc).__name__}: {exc}")
        self.write_seconds += time.perf_counter() - start

    def _handle(self, item: tuple[Any, ...], open_shards: OpenShards) -> None:
        kind, step = item[0], item[1]
        directory = fmt.step_dir(self.root, self.rank, step)
        if kind == "tensor":
            _, _, name, key, dtype, shape, buffer, nbytes = item
            current = open_shards.get(step)
            if current is not None and current[0] != name:
                self._close_shards(open_shards, step)
                current = None
            if current is None:
                current = open_shards[step] = (name, [])
            current[1].append((key, dtype, shape, buffer))
            self.tensor_bytes += nbytes
        elif kind == "shard":
            _, _, name, chunks, size, nbytes, _ = item
            directory.mkdir(parents=True, exist_ok=True)
            write_chunks(directory / name, chunks, size)
            self.tensor_bytes += nbytes
        elif kind == "rows":
            import pyarrow.parquet as pq

            _, _, name, rows, _ = item
            directory.mkdir(parents=True, exist_ok=True)
            table = _table_of(rows)
            tmp = directory / f"{name}.tmp"
            # zstd sets up a compressor per column and file: for a small step's rows it costs more
            # than it saves (a millisecond a file for a few hundred rows; they take a few kB)
            pq.write_table(table, tmp, compression="zstd" if table.num_rows >= COMPRESS_ROWS else "none",
                           memory_pool=POOL,
                           **getattr(rows, "parquet_options", {}))  # a capture's own (TensorFlow's tables)
            os.replace(tmp, directory / name)
            self.records += table.num_rows

    def _end_step(self, step: int, open_shards: OpenShards) -> None:
        """A step complete: its open tensor shard closed, the step listed (most steps have no
        shard open: no Python round trip through _guard for them)."""
        if self.error is None and step in open_shards:
            self._guard(self._close_shards, open_shards, step)
        if self.error is None and step not in self._steps_seen:  # (a set: a list's scan grew with the run)
            self._steps_seen.add(step)
            self.steps.append(step)  # rank.json lists it at the round's end, after its rows are written

    def _close_shards(self, open_shards: OpenShards, step: int | None) -> None:
        for s in [step] if step is not None else list(open_shards):
            current = open_shards.pop(s, None)
            if current and current[1]:
                directory = fmt.step_dir(self.root, self.rank, s)
                directory.mkdir(parents=True, exist_ok=True)
                write_shard(directory / current[0], current[1])

    # -- layout ------------------------------------------------------------------------
    def _write_status(self, status: str, error: str | None = None) -> None:
        # one line: rewritten every second while the dump runs, with every step written so far
        fmt.write_json(fmt.rank_dir(self.root, self.rank) / fmt.RANK_STATUS, {
            "rank": self.rank, "status": status, "error": error, "steps": sorted(self.steps),
            "records": self.records, "tensor_bytes": self.tensor_bytes, "waited_s": round(self.waited_seconds, 3),
            "run_id": self.manifest.get("run_id"),
            "pid": os.getpid(), "updated": _now()}, indent=None)
        # every rank rewrites the manifest; the last one to close lists them all
        ranks = sorted(int(d.name[4:]) for d in self.root.glob("rank*") if d.name[4:].isdigit())
        with self._manifest_lock:
            self.manifest["status"], self.manifest["ranks"] = status, ranks
            fmt.write_json(self.root / fmt.MANIFEST, self.manifest)


def _batched(rows: Any) -> int:
    """The rows of a step that go into the round's batch file, else 0: a small index, and none
    that asks for its own Parquet options unless it says they hold for a batch file too
    (``batch_options``: the batch is written with them when all its parts have the same)."""
    n = _n_rows(rows)
    if n >= BATCH_STEP_ROWS:
        return 0
    options = getattr(rows, "parquet_options", None)
    return n if not options or getattr(rows, "batch_options", False) else 0


def _batch_options(payloads: list[Any]) -> dict[str, Any]:
    """The Parquet options of a batch file: its parts' own where they all ask for the same."""
    options = [getattr(p, "parquet_options", None) or {} for p in payloads]
    return options[0] if all(o == options[0] for o in options) else {}


def _n_rows(rows: Any) -> int:
    """The rows of a step's payload: an Arrow table, a capture's columns or a list of rows."""
    return int(rows.num_rows) if hasattr(rows, "num_rows") else len(rows)


def _table_of(rows: Any) -> pa.Table:
    if isinstance(rows, pa.Table):
        return rows
    return rows.table() if hasattr(rows, "table") else rows_to_table(rows)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
