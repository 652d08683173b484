"""The monitor's series as TensorBoard scalars, through the ``tensorboard`` package (optional:
``pip install tensorboard``, or the ``opscope[tensorboard]`` extra).

One TensorBoard run per rank (``<logdir>/rank<R>``), one event per monitored step holding
every scalar of the step: ``<kind>/<name>/norm`` and ``<kind>/<name>/max`` of each tensor
(``grad/layers.0.fc1.weight/norm``), ``.../nan`` and ``.../inf`` at the steps where they
are not 0, ``loss`` and ``lr`` (``lr.group1`` ...). Written by the monitor's background
thread (the judge) with tensorboard's protos and record writer into a file named as
tensorboard's own writer names it (``events.out.tfevents.<time>.<host>.<pid>...``), flushed
every 10 seconds and at stop. (Not through tensorboard's ``EventFileWriter``: its file
layer is ``tf.io.gfile``, which imports TensorFlow when it is installed: seconds, in a
PyTorch process.) The Parquet series stay the record, TensorBoard a view of it.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np

from opscope.errors import ConfigError
from opscope.monitor.registry import SeriesTable

FLUSH_SECONDS = 10.0


def _tensorboard() -> tuple[Any, Any, Any]:
    try:
        from tensorboard.compat.proto.event_pb2 import Event  # type: ignore[import-untyped]
        from tensorboard.compat.proto.summary_pb2 import Summary  # type: ignore[import-untyped]
        from tensorboard.summary.writer.record_writer import RecordWriter  # type: ignore[import-untyped]
    except ImportError as exc:
        raise ConfigError("monitor: tensorboard is set but the tensorboard package is not installed; "
                          "pip install tensorboard (or opscope[tensorboard]), or drop the tensorboard key") from exc
    return Event, Summary, RecordWriter


class ScalarWriter:
    """Writes one rank's steps as TensorBoard scalars under ``logdir/rank<rank>`` (``series``
    names the ids the steps come with)."""

    def __init__(self, logdir: str | Path, rank: int, series: SeriesTable) -> None:
        self.series = series
        self._event, self._summary, records = _tensorboard()
        self.dir = Path(logdir) / f"rank{rank}"
        self.dir.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.opscope"
        self._writer = records(open(self.dir / name, "wb"))  # noqa: SIM115 (closed in close())
        self._writer.write(self._event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
        self._writer.flush()
        self._flushed = time.monotonic()
        self._tags: dict[int, list[str]] = {}  # with tensorboard only: four strings a series

    def _tags_of(self, i: int) -> list[str]:
        tags = self._tags.get(i)
        if tags is None:
            kind, name = self.series.key(i)
            tags = self._tags[i] = [f"{kind}/{name}/{stat}" for stat in ("norm", "max", "nan", "inf")]
        return tags

    def add(self, step: int, blocks: list[tuple[np.ndarray, np.ndarray]], scalars: dict[int, float]) -> None:
        """One step: each tensor's ``[norm, max, nan, inf]`` (blocks of series ids and their
        statistics) and the loss and learning rates (by id)."""
        value = self._summary.Value
        values = []
        for ids, stats in blocks:
            for i, (norm, mx, nan, inf) in zip(ids.tolist(), stats.tolist(), strict=True):
                tags = self._tags_of(i)
                values += [value(tag=tags[0], simple_value=norm), value(tag=tags[1], simple_value=mx)]
                if nan:
                    values.append(value(tag=tags[2], simple_value=nan))
                if inf:
                    values.append(value(tag=tags[3], simple_value=inf))
        values += [value(tag=self.series.names[i], simple_value=v) for i, v in scalars.items()]
        if values:
            summary = self._summary(value=values)
            self._writer.write(self._event(step=step, wall_time=time.time(), summary=summary).SerializeToString())
        if time.monotonic() - self._flushed > FLUSH_SECONDS:
            self._writer.flush()
            self._flushed = time.monotonic()

    def close(self) -> None:
        """Write what is held and close the event file."""
        if not self._writer.closed:
            self._writer.flush()
            self._writer.close()
