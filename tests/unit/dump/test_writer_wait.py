"""The time the training thread waits for the dump's writer: counted when the queue is full
(the disk behind the steps), zero when the writer keeps up, in rank.json, and said in the
dump's notes when it is long."""

from __future__ import annotations

import json

import numpy as np
import torch

import opscope
from opscope.demo.models import mlp_task, train_step
from opscope.storage import writer as writer_module
from opscope.storage.writer import DumpWriter

MB = 1 << 20


def _write(path, queue_limit: int) -> DumpWriter:
    """Two 0.75 MB tensors of one step through a writer whose queue holds ``queue_limit``."""
    writer = DumpWriter(path, 0, {"format_version": "3.0"}, queue_limit=queue_limit)
    writer.open()
    # made first: numpy's fill lets the writer thread run, the puts one after the other do not
    tensors = [np.full(3 * MB // 16, i, dtype=np.float32) for i in range(2)]
    for i, data in enumerate(tensors):
        writer.add_tensor(0, f"r{i}", "F32", [data.size], memoryview(data), data.nbytes)
    writer.end_step(0)
    writer.close()
    return writer


def test_a_full_queue_is_waited_for_and_said_in_rank_json(tmp_path):
    full = _write(tmp_path / "small", queue_limit=MB)  # the second tensor waits for the first
    assert full.waited_seconds > 0
    status = json.loads((tmp_path / "small" / "rank0" / "rank.json").read_text())
    assert status["waited_s"] == round(full.waited_seconds, 3)
    assert status["tensor_bytes"] == 2 * (3 * MB // 4)


def test_a_queue_with_room_is_never_waited_for(tmp_path):
    roomy = _write(tmp_path / "large", queue_limit=64 * MB)
    assert roomy.waited_seconds == 0.0
    assert json.loads((tmp_path / "large" / "rank0" / "rank.json").read_text())["waited_s"] == 0.0


def test_a_long_wait_is_a_note_of_the_dump(tmp_path, monkeypatch):
    """A tensor dump through a 1 MB queue (every step's tensors exceed it): the notes say how long
    the training thread waited, and what shortens it; a dump that never waited says nothing."""
    monkeypatch.setattr(writer_module, "WAIT_NOTE_S", 0.0)
    notes = {}
    for name, limit in (("full", MB), ("roomy", 256 * MB)):
        torch.manual_seed(0)
        model, opt, batch = mlp_task(batch=64, d_in=256, hidden=256, depth=2)
        with opscope.dump(tmp_path / name, level="aten", data="tensor", steps="1-2") as d:
            d.writer.queue_limit = limit
            for i in range(3):
                train_step(model, opt, *batch(i))
                d.step()
        notes[name] = opscope.load(tmp_path / name).manifest["notes"]
    said = [n for n in notes["full"] if "waited" in n]
    assert len(said) == 1 and "for the disk" in said[0] and "tensor_ops" in said[0]
    assert not [n for n in notes["roomy"] if "waited" in n]


def test_the_manifest_changed_while_the_writer_writes_it(tmp_path):
    """The writer thread writes the manifest with its status every second; a session adds its
    notes (and the native backend, the compiled graphs) from the training thread meanwhile.
    Unlocked, json met a dict that changed size and the dump failed at its end ("dump writer
    failed: RuntimeError: dictionary changed size during iteration", Whisper's in session 22)."""
    import sys
    import threading

    writer = DumpWriter(tmp_path / "d", 0, {"format_version": "3.0"})
    writer.open()
    failures: list[BaseException] = []
    written = [0]
    stop = threading.Event()

    def status_loop() -> None:  # what the writer's rounds do, as often as they can
        while not stop.is_set():
            try:
                writer._write_status("running")
            except BaseException as exc:  # noqa: BLE001 - the failure is the test's
                failures.append(exc)
                return
            written[0] += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can: the race shows at once
    thread = threading.Thread(target=status_loop)
    thread.start()
    i = 0
    try:
        while written[0] < 100 and not failures:  # the session's edits, while 100 statuses are written
            with writer.editing_manifest() as manifest:
                manifest[f"note{i % 500}"] = "x" * (i % 64)
                if i % 500 == 499:
                    manifest.clear()
                    manifest["format_version"] = "3.0"
            i += 1
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    writer.close()
    assert not failures, failures
    assert json.loads((tmp_path / "d" / "manifest.json").read_text())["status"] == "complete"
