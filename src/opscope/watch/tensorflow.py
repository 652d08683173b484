"""The first NaN/Inf op of a TensorFlow / Keras step, with its layer, inputs and chain.

``tf.debugging.enable_check_numerics`` names the op but gives no values. This runs the
TensorFlow dump's capture without writing anything (:class:`~opscope.capture.tensorflow.session.TFDumpSession`
with ``write=False``) and reads each graph run's records in execution order: the first
output holding a NaN or Inf is the hit; its inputs' statistics and the chain back through
the producers of abnormal inputs come from the same records. An output whose NaN or Inf
every reader (all ``tf.where`` selects) drops is not a hit. The events are
:class:`~opscope.watch.events.OverflowEvent`, as for PyTorch. Graphs hand their tensors over
when they finish, so a hit is reported after the graph run that produced it (the step's
end in Keras ``fit``), not in the middle of it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from opscope.capture.tensorflow.session import TFDumpSession
from opscope.config import DumpConfig
from opscope.config.values import StepSelection
from opscope.errors import OverflowDetected
from opscope.model.records import COL, STATS
from opscope.watch.events import ChainLink, OverflowEvent, TensorSummary, WatchResult

_ID, _IO, _SEQ, _STEP, _PRODUCER = COL["id"], COL["io"], COL["seq"], COL["step"], COL["producer"]
_NAN, _INF = 6, 7  # positions in the statistics tuple
ACTIONS = ("raise", "warn", "record")
MASKS = frozenset({"tf.SelectV2", "tf.Select"})  # ops that may drop a NaN input (tf.where)
# overflow-section keys the PyTorch watch has and this one does not
TORCH_ONLY = ("limit", "path", "loss_spike", "time_spike")


class TFWatch:
    """A running TensorFlow overflow watch; ``stop()`` returns a :class:`WatchResult`.

    Args:
        action: ``raise`` (:class:`OverflowDetected` at the step's end), ``warn`` (print the
            report once per op) or ``record`` (keep the events only).
        steps: the steps watched.
        report: ``report(event) -> str`` (handed in by the public API).
    """

    def __init__(self, action: str = "raise", steps: Any = "all", model: Any = None,
                 report: Callable[[OverflowEvent], str] | None = None) -> None:
        if action not in ACTIONS:
            from opscope.errors import ConfigError

            raise ConfigError(f"action: {action!r} is not allowed; allowed: {', '.join(ACTIONS)}")
        self.action, self.report = action, report or (lambda e: f"{e.kind} in {e.op} ({e.module})")
        cfg = DumpConfig(path="(watch)", steps=StepSelection(steps))
        self.session = TFDumpSession(cfg, "op", model, on_rows=self._scan, write=False)
        self.events: list[OverflowEvent] = []
        self._rows: dict[int, list[Any]] = {}
        self._step = -1
        self._warned: set[tuple[str, str]] = set()

    # -- lifecycle, as the dump's ------------------------------------------------------
    def start(self) -> TFWatch:
        self.session.start()
        return self

    def step(self) -> None:
        self.session.step()

    def callback(self) -> Any:
        """This watch as a Keras callback (``model.fit(callbacks=[w.callback()])``)."""
        return self.session.callback()

    @property
    def stopped(self) -> bool:
        return bool(self.session.stopped)

    def stop(self) -> WatchResult:
        self.session.stop()
        return WatchResult(events=list(self.events), steps=self.session.clock.step)

    def __enter__(self) -> TFWatch:
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.session.stop(exc)

    # -- the scan ----------------------------------------------------------------------
    def _scan(self, rows: list[list[Any]]) -> None:
        step = rows[0][_STEP]
        if step != self._step:
            self._rows.clear()
            self._step = step
        for row in rows:
            self._rows[row[_ID]] = row
        for row in rows:
            if row[_IO] == "output" and _abnormal(row) and not self._masked(row, rows):
                self._hit(self._event(row))
                return

    def _masked(self, row: list[Any], rows: list[list[Any]]) -> bool:
        """A NaN/Inf that only selects read and none lets through: every op reading ``row``
        is a select (``tf.where``) whose outputs are finite. TensorFlow's deterministic sparse
        cross-entropy broadcasts a NaN (for labels out of range) that a ``SelectV2`` then
        drops: no overflow, and no hit (it was one, session 12)."""
        readers = [r for r in rows if r[_IO] != "output" and r[_PRODUCER] == row[_ID]]
        if not readers or any(r[COL["op"]] not in MASKS for r in readers):
            return False
        seqs = {r[_SEQ] for r in readers}
        outputs = [r for r in rows if r[_SEQ] in seqs and r[_IO] == "output"]
        return len({r[_SEQ] for r in outputs}) == len(seqs) and not any(_abnormal(r) for r in outputs)

    def _hit(self, event: OverflowEvent) -> None:
        self.events.append(event)
        if self.action == "raise":
            raise OverflowDetected(self.report(event), event)
        key = (event.op, event.module)
        if self.action == "warn" and key not in self._warned:
            self._warned.add(key)
            print(self.report(event), file=sys.stderr)

    def _event(self, row: list[Any]) -> OverflowEvent:
        stats = row[STATS]
        kind = "nan" if stats[_NAN] else ("inf" if (stats[1] or 0) > 0 else "-inf")
        inputs = [r for r in self._rows.values() if r[_SEQ] == row[_SEQ] and r[_IO] != "output"]
        return OverflowEvent(
            kind=kind, op=row[COL["op"]], module=row[COL["module"]], phase=row[COL["phase"]], step=row[_STEP],
            rank=row[COL["rank"]], level="tf-op", dtype=row[COL["dtype"]], shape=row[COL["shape"]],
            nan=stats[_NAN], inf=stats[_INF], min=stats[0], max=stats[1], fwd_op=row[COL["fwd_op"]],
            node=row[COL["node"]] if row[COL["phase"]] == "backward" else None,
            inputs=[self._summary(r) for r in inputs], chain=self._chain(row))

    def _summary(self, row: list[Any]) -> TensorSummary:
        s = row[STATS]
        producer = self._rows.get(row[_PRODUCER]) if row[_PRODUCER] is not None else None
        origin = (f"parameter {row[COL['param']]}" if row[COL["param"]] else
                  f"{producer[COL['op']]} in {producer[COL['module']] or '(top level)'}" if producer is not None
                  else "a constant or a graph input")
        return TensorSummary(slot=row[COL["slot"]], name=row[COL["arg"]], dtype=row[COL["dtype"]],
                             shape=row[COL["shape"]], min=s[0], max=s[1], mean=s[2], std=s[3], nan=s[_NAN],
                             inf=s[_INF], zeros=s[8], origin=origin)

    def _chain(self, row: list[Any]) -> list[ChainLink]:
        """From the earliest abnormal output to ``row``: the hit is the first abnormal output
        in execution order, so its chain is the op itself unless an input was already
        abnormal when it was produced by an op not recorded as an output here."""
        stats = row[STATS]
        return [ChainLink(op=row[COL["op"]], module=row[COL["module"]], phase=row[COL["phase"]],
                          reason="first NaN/Inf", min=stats[0], max=stats[1], fwd_op=row[COL["fwd_op"]])]


def from_config(cfg: Any, report: Callable[[OverflowEvent], str]) -> TFWatch | None:
    """The watch the ``overflow`` section starts in a TensorFlow program (``opscope run``,
    ``$OPSCOPE_CONFIG``): its ``action`` and ``steps``; None when the script holds its own."""
    main = sys.modules.get("__main__")
    if main is not None and any(isinstance(v, TFWatch) for v in vars(main).values()):
        return None
    unused = [k for k in TORCH_ONLY if getattr(cfg, k, None) is not None]
    if unused:
        print(f"opscope: overflow keys {', '.join(unused)} are for PyTorch programs; "
              "a TensorFlow program's watch uses action and steps", file=sys.stderr)
    return TFWatch(cfg.action, cfg.steps.spec, report=report)


def _abnormal(row: list[Any]) -> bool:
    stats = row[STATS]
    return bool(stats[_NAN] or stats[_INF])
