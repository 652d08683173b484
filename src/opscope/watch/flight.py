"""The flight recorder behind ``opscope.watch(action="record")``.

A statistics dump runs all the time, but into a ring buffer in memory that holds the rows
of the last ``history`` steps. When a trigger fires at the end of step S (NaN/Inf, a loss
spike, a step-time spike), the ring is written out as an ordinary dump (steps S-history+1
.. S, statistics) and step S+1 goes straight to that dump, with full tensors for the ops
on the chain of the event. ``opscope show`` and ``opscope compare`` read it like any dump.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from opscope.capture.torch.session import DumpSession
from opscope.config import DumpConfig, Filter, StepSelection
from opscope.storage.writer import DumpWriter


class RingWriter:
    """Stands in for :class:`DumpWriter`: keeps the rows of the last ``history`` steps in
    memory (row lists from the Python capture, column sets from the native one); while a
    real writer is attached (``sink``), passes everything on to it."""

    def __init__(self, history: int, shard_bytes: int, queue_limit: int) -> None:
        self.steps: deque[tuple[int, list[tuple[str, Any]]]] = deque(maxlen=history)
        self.manifest: dict[str, Any] = {}
        self.shard_bytes, self.queue_limit = shard_bytes, queue_limit  # what the native capture asks
        self.sink: DumpWriter | None = None
        self.sink_step: int | None = None
        self.on_sink_done: Any = None
        self._open: dict[int, list[tuple[str, Any]]] = {}

    @contextlib.contextmanager
    def editing_manifest(self) -> Iterator[dict[str, Any]]:
        """The ring's own manifest (DumpWriter's has a thread writing it; this one has none)."""
        yield self.manifest

    @property
    def error(self) -> BaseException | None:
        """The attached writer's failure (the ring itself cannot fail)."""
        return self.sink.error if self.sink is not None else None

    def add_tensor(self, step: int, key: str, dtype: str, shape: list[int], buffer: Any, nbytes: int) -> str:
        if self.sink is not None:
            return self.sink.add_tensor(step, key, dtype, shape, buffer, nbytes)
        return ""  # statistics only while recording into the ring

    def add_shard(self, step: int, chunks: list[Any], size: int, nbytes: int) -> str | None:
        if self.sink is not None:
            return self.sink.add_shard(step, chunks, size, nbytes)
        return None  # statistics only while recording into the ring

    def add_rows(self, step: int, rows: list[list[Any]]) -> None:
        if self.sink is not None:
            self.sink.add_rows(step, rows)
        elif rows:
            self._open.setdefault(step, []).append(("rows", rows))

    def add_table(self, step: int, table: Any) -> None:
        if self.sink is not None:
            self.sink.add_table(step, table)
        elif table.num_rows:
            self._open.setdefault(step, []).append(("table", table))

    def end_step(self, step: int) -> None:
        if self.sink is not None:
            self.sink.end_step(step)
            if step == self.sink_step and self.on_sink_done is not None:
                self.on_sink_done()
            return
        parts = self._open.pop(step, [])
        if parts:  # an empty step (the run stopped right after a boundary) evicts nothing
            self.steps.append((step, parts))

    def write_to(self, sink: DumpWriter) -> list[int]:
        """Hand the ring's steps to ``sink``; returns them."""
        kept = []
        for step, parts in self.steps:
            for kind, part in parts:
                sink.add_rows(step, part) if kind == "rows" else sink.add_table(step, part)
            sink.end_step(step)
            kept.append(step)
        self.steps.clear()
        return kept

    def check(self) -> None:
        if self.sink is not None:
            self.sink.check()

    def close(self, status: str = "complete", error: str | None = None) -> None:
        if self.on_sink_done is not None and self.sink is not None:
            self.on_sink_done(status, error)


class FlightRecorder:
    """A statistics dump into a :class:`RingWriter`, whose steps the watch drives.

    It holds a :class:`DumpSession` (the capture, with the ring in place of a writer) and
    decides, on a trigger, where the ring goes and which ops keep full tensors next.
    """

    def __init__(self, path: str, level: str, history: int) -> None:
        self.history = history
        self.written: list[str] = []
        self.pending_notes: list[str] = []
        cfg = DumpConfig(path=path, steps=StepSelection("all"), level=level, data="statistics")
        self.dump = DumpSession(cfg, open_writer=self._open_ring)

    @property
    def started(self) -> bool:
        return self.dump.started

    def start(self) -> FlightRecorder:
        self.dump.start()
        self.dump.clock.manual = True  # steps end only when the watch says so
        return self

    def finish(self, status: str, error: str | None = None) -> None:
        """Stop capturing; a dump being written gets ``status``."""
        self.dump.finish(status, error)

    def _open_ring(self) -> RingWriter:
        cfg = self.dump.cfg
        ring = RingWriter(self.history, int(cfg.shard_mb * 2**20), int(cfg.queue_limit_mb * 2**20))
        ring.on_sink_done = self._sink_done
        return ring

    @property
    def ring(self) -> RingWriter:
        # the dump session writes into what _open_ring handed it; its attribute is typed DumpWriter
        return self.dump.writer  # type: ignore[return-value]

    def end_step(self) -> None:
        """End the current step (the watch calls this at each of its boundaries)."""
        if self.dump.started and self.dump.active:
            self.dump.clock.user_step()

    def trigger(self, step: int, reason: str, tensor_ops: list[str], event: dict[str, Any] | None) -> str | None:
        """Write the ring (which ends with ``step``) as a dump; the next step goes there too,
        with full tensors for ``tensor_ops``. Returns the dump path (None if one is being written)."""
        ring, dump = self.ring, self.dump
        if not dump.active or ring.sink is not None:
            return None
        path = _free_path(dump.cfg.path)
        kept = [s for s, _ in ring.steps]
        manifest = self._manifest(path, tensor_ops)
        manifest["flight_recorder"] = {"trigger": reason, "step": step, "history_steps": kept,
                                       "tensor_step": step + 1, "tensor_ops": tensor_ops, "event": event}
        self.pending_notes = [f"flight recorder: {reason} at step {step}; steps {kept} are statistics kept in memory, "
                              f"step {step + 1} adds full tensors for {', '.join(tensor_ops) or 'no op'}"]
        sink = dump.new_writer(path, manifest)
        ring.write_to(sink)
        ring.sink, ring.sink_step = sink, step + 1
        dump.cfg.tensor_ops = Filter(tuple(tensor_ops)) if tensor_ops else Filter(("<none>",))
        self._replan()
        if dump.capturing:  # the next step has begun (nothing recorded yet): begin it again with the new plan
            dump.recorder.begin_step(dump.clock.step)
        self.written.append(path)
        return path

    def _manifest(self, path: str, tensor_ops: list[str]) -> dict[str, Any]:
        manifest = self.dump.manifest()
        manifest["config"] = dict(manifest["config"], path=path, tensor_ops={"include": tensor_ops, "exclude": []})
        manifest["stats_backend"] = self.ring.manifest.get("stats_backend", manifest["stats_backend"])
        return manifest

    def _replan(self) -> None:
        """The recorder decides which calls keep tensors from its config when it is built
        (its ``plan``): rebuild that decision after ``tensor_ops`` changed."""
        if hasattr(self.dump, "recorder"):  # the dump session sets it when it starts
            from opscope.capture.torch.suspects import TensorPlan

            self.dump.recorder.plan = TensorPlan.make(self.dump.cfg, self.dump.rank)

    def _sink_done(self, status: str = "complete", error: str | None = None) -> None:
        ring = self.ring
        sink, ring.sink, ring.sink_step = ring.sink, None, None
        self.dump.cfg.tensor_ops = Filter()
        self._replan()
        if sink is not None:
            with sink.editing_manifest() as manifest:  # (its writer thread still runs)
                manifest["notes"] = list(self.pending_notes)
            sink.close(status, error)


def _free_path(path: str) -> str:
    """``path``, or ``path-2``, ``path-3``, ... when a dump is already there."""
    candidate, n = path, 1
    while Path(candidate).exists() and any(Path(candidate).iterdir()):
        n += 1
        candidate = f"{os.fspath(path)}-{n}"
    return candidate
