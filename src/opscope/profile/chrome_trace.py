"""Chrome trace event files (``trace.json.gz``), written and merged as a stream.

The file is ``{"traceEvents":[`` on the first line, one event per line, and a trailer line
starting with ``]``. Perfetto UI and chrome://tracing open it as is; opscope merges rank
files line by line, so no trace is ever held in memory whole.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from opscope.errors import ProfileError

HEADER = '{"traceEvents":[\n'
PARTIAL = ".partial"

# Track ids inside each rank's process: opscope's spans sort above torch.profiler's threads.
TID_STEPS, TID_PHASES, TID_COMM = 1, 2, 3
TID_STREAM_BASE = 1_000_000


class TraceWriter:
    """Streams events into ``path + '.partial'``; :meth:`finish` renames it to ``path``.

    A write error (disk full) never reaches the training loop: writing stops, and
    :meth:`finish` reports it as a :class:`ProfileError`.
    """

    def __init__(self, path: str | os.PathLike, rank: int) -> None:
        self.path = Path(path)
        self.partial = self.path.with_name(self.path.name + PARTIAL)
        self.events = 0
        self.raw_bytes = 0
        # Open for the session's whole life; finish() or abort() closes it.
        self._file = gzip.open(self.partial, "wt", encoding="utf-8", compresslevel=5)  # noqa: SIM115
        self._file.write(HEADER)
        self._first = True
        self.failed: OSError | None = None
        self._known_threads: set[int] = set()
        for event in rank_metadata(rank):
            self.event(event)

    def event(self, event: dict[str, Any]) -> None:
        """Append one event."""
        if self.failed is not None:
            return
        line = json.dumps(event, separators=(",", ":"))
        try:
            self._file.write(line if self._first else ",\n" + line)
        except OSError as exc:
            self.failed = exc
            return
        self._first = False
        self.events += 1
        self.raw_bytes += len(line) + 2

    def flush(self) -> None:
        """Push everything written so far through the compressor to the file."""
        if self.failed is None:
            try:
                self._file.flush()
            except OSError as exc:
                self.failed = exc

    def name_thread(self, rank: int, tid: int, name: str, sort_index: int) -> None:
        """Name a track once (Perfetto shows the name and sorts by the index)."""
        if tid in self._known_threads:
            return
        self._known_threads.add(tid)
        self.event({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}})
        self.event({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid,
                    "args": {"sort_index": sort_index}})

    def finish(self, other: dict[str, Any] | None = None) -> Path:
        """Close the event list and publish the file under its final name."""
        try:
            if self.failed is not None:
                raise self.failed
            self._file.write("\n" + _trailer(other))
            self._file.close()
            os.replace(self.partial, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                self._file.close()
            raise ProfileError(f"could not write {self.path}: {exc.strerror or exc}; check free space and "
                               f"permissions (what was written is in {self.partial.name})") from exc
        return self.path

    def abort(self, reason: str) -> Path:
        """Close what was written and leave it as ``.partial`` with the reason (best effort:
        when the disk itself failed, the partial file may end early)."""
        if not self._file.closed:
            with contextlib.suppress(OSError):
                self._file.write("\n" + _trailer({"status": "partial", "reason": reason}))
            with contextlib.suppress(OSError):
                self._file.close()
        return self.partial


def _trailer(other: dict[str, Any] | None) -> str:
    return '],"displayTimeUnit":"ms","otherData":' + json.dumps(other or {}) + "}\n"


def rank_metadata(rank: int) -> list[dict[str, Any]]:
    """Process name and the three opscope tracks of one rank."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}},
        {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}},
    ]
    for tid, name in ((TID_STEPS, "opscope steps"), (TID_PHASES, "opscope phases"),
                      (TID_COMM, "opscope communication")):
        events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid,
                       "args": {"sort_index": tid - 10}})
    return events


def iter_event_lines(path: str | os.PathLike) -> Iterator[str]:
    """The event lines of an opscope trace file, without separators, one at a time."""
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        first = handle.readline()
        if first != HEADER:
            raise ValueError(f"{path} is not an opscope trace file (unexpected first line)")
        for line in handle:
            if line.startswith("]"):
                return
            line = line.rstrip("\n").rstrip(",")
            if line:
                yield line


def merge(sources: Iterable[str | os.PathLike], dest: str | os.PathLike, other: dict[str, Any] | None = None) -> Path:
    """Concatenate the events of several trace files into one, streaming, written atomically."""
    dest = Path(dest)
    tmp = dest.with_name(dest.name + PARTIAL)
    first = True
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=5) as out:
        out.write(HEADER)
        for source in sources:
            for line in iter_event_lines(source):
                out.write(line if first else ",\n" + line)
                first = False
        out.write("\n" + _trailer(other))
    os.replace(tmp, dest)
    return dest


def span(name: str, rank: int, tid: int, start_us: float, dur_us: float,
         args: dict[str, Any] | None = None) -> dict[str, Any]:
    """A complete ("X") event."""
    event: dict[str, Any] = {"ph": "X", "name": name, "pid": rank, "tid": tid, "ts": round(start_us, 3),
                             "dur": round(max(dur_us, 0.0), 3)}
    if args:
        event["args"] = args
    return event
