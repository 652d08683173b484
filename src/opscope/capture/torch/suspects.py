"""Which op calls get full tensors, and how many bytes of them a dump may store.

- **Two-pass dumping**: ``suspects`` names a compare result (its ``-o`` directory or
  summary.json). Its culprits list, per side, the call itself and the calls that produced
  its inputs as (phase, module, op, call index); those calls, at the culprit's rank and
  step, get full tensors, everything else statistics. Both sides' calls are taken, so the
  same config serves the target's and the reference's second run. Before capture starts,
  the size is estimated from the first pass's own records (numel x dtype size of the rows
  that will hold a tensor).
- **Size**: a plain tensor dump (``data="tensor"`` / ``tensor_ops``) says its size before any
  tensor is written, from ``estimate_from`` (an earlier dump's records) or a size probe of the
  step before the window, both counted by :func:`tensor_bytes`; a window at step 0 with
  neither says so at start, and its first step is measured while written.
- **Limit**: ``tensor_limit_mb`` caps the bytes of tensors stored per rank; past it tensor
  capture stops (the run goes on, statistics go on) and the manifest says where.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from opscope.capture.torch.tensor_size import (
    ITEMSIZE,
    Source,
    Wants,
    differs,
    human,
    places_views,
    table_rows,
    tensor_bytes,
)
from opscope.config import DumpConfig
from opscope.errors import ConfigError, DumpFormatError
from opscope.model.records import COL

LOG = logging.getLogger("opscope.dump")
_PRODUCER, _NOTE, _NUMEL, _DTYPE = COL["producer"], COL["note"], COL["numel"], COL["dtype"]
_OP, _MODULE, _PHASE, _CALL = COL["op"], COL["module"], COL["phase"], COL["call"]
_VIEW, _ID, _IO = COL["view"], COL["id"], COL["io"]
LARGE = 1 << 30  # a per-step estimate this big is a warning, not just a log line
CallKey = tuple[int, str, str, str, int]  # step, phase, module, op, call
_FIX = "Narrow it with tensor_ops or scope, or cap it with tensor_limit_mb"


class TensorDumpSize(UserWarning):
    """How big a tensor dump will be, or where its tensor limit stopped it."""


class TensorPlan:
    """Decides per op call whether full tensors are stored, and keeps the byte budget.

    Args:
        cfg: the dump configuration (``data``, ``tensor_ops``, ``suspects``, ``tensor_limit_mb``).
        rank: this process's rank (suspects are per rank).
    """

    def __init__(self, cfg: DumpConfig, rank: int) -> None:
        self.rank = rank
        self.every = cfg.data == "tensor"
        self.tensor_ops = cfg.tensor_ops if cfg.tensor_ops else None
        self.limit_mb = cfg.tensor_limit_mb
        self.limit = None if cfg.tensor_limit_mb is None else int(cfg.tensor_limit_mb * 2**20)
        self.selected_steps = cfg.steps.steps
        # data="tensor" keeps a view as its input's data plus its geometry; with tensor_ops or
        # suspects each view is stored in its own layout (as Recorder.views_share_data)
        self.place_views = self.every and not cfg.suspects and not cfg.tensor_ops
        self.keys: frozenset[CallKey] | None = None
        self.stored = 0
        self.step_bytes: dict[int, list[int]] = {}  # step -> [bytes, tensors]
        self.stopped: dict[str, Any] | None = None
        self.estimate: dict[str, Any] | None = None
        self.notes: list[str] = []
        if cfg.suspects:
            self.keys, self.estimate = load_suspects(cfg.suspects, rank)
            _say(self.estimate["message"], warn=True)

    @classmethod
    def make(cls, cfg: DumpConfig, rank: int) -> TensorPlan | None:
        """A plan when the dump may store tensors at all, else None (nothing to decide)."""
        if cfg.data == "tensor" or cfg.tensor_ops or cfg.suspects:
            return cls(cfg, rank)
        return None

    def wants(self, step: int, phase: str, module: str, op: str, call: int) -> bool:
        """Full tensors for this call? Runs per op: set lookups only."""
        if self.stopped is not None:
            return False
        if self.keys is not None and (step, phase, module, op, call) in self.keys:
            return True
        if self.tensor_ops is not None:
            return self.tensor_ops.matches(op)
        return self.every

    def admit(self, row: list[Any], nbytes: int, where: tuple[Any, ...]) -> bool:
        """Count a tensor about to be stored; False (and capture stops) past the limit."""
        if self.stopped is not None:
            return False
        if self.limit is not None and self.stored + nbytes > self.limit:
            self._stop(nbytes, where)
            return False
        self.stored += nbytes
        step = self.step_bytes.setdefault(where[0], [0, 0])
        step[0] += nbytes
        step[1] += 1
        return True

    def budget(self) -> int:
        """Bytes that may still be stored before the limit (-1: no limit), for a capture that
        admits tensors itself (the native dump) and reports them with :meth:`admitted`."""
        return -1 if self.limit is None else max(self.limit - self.stored, 0)

    def admitted(self, step: int, nbytes: int, count: int, refused: tuple[Any, ...] | None) -> None:
        """What such a capture stored in ``step`` (``count`` tensors, ``nbytes``), and the tensor
        the limit refused: None or ``(nbytes, phase, module, op, io, slot)``; as :meth:`admit`
        would have counted them one by one."""
        if count:
            self.stored += nbytes
            entry = self.step_bytes.setdefault(step, [0, 0])
            entry[0] += nbytes
            entry[1] += count
        if refused is not None and self.stopped is None:
            self._stop(refused[0], (step, *refused[1:]))

    def end_step(self, step: int) -> None:
        """After the first step that stored tensors: report its size and the projection."""
        if self.estimate is not None or step not in self.step_bytes or len(self.step_bytes) != 1:
            return
        nbytes, count = self.step_bytes[step]
        steps = None if self.selected_steps is None else len(self.selected_steps)
        total = f"the {steps} selected steps will hold about {human(nbytes * steps)}" if steps else \
            "every step is selected: about that much per step"
        if self.stopped is not None:
            total = "then tensor_limit_mb stopped tensor capture (the manifest says where)"
        msg = (f"opscope dump: step {step} on rank {self.rank} stored {human(nbytes)} of full tensors "
               f"({count} tensors); {total}. {_FIX}")
        self.estimate = {"basis": f"measured while step {step} was written", "bytes_per_step": {str(step): nbytes},
                         "message": msg}
        _say(msg, warn=nbytes >= LARGE or (self.limit is not None and nbytes * (steps or 1) > self.limit))

    def estimate_from(self, step: int, rows: list[list[Any]], wants: Wants) -> None:
        """Estimate a tensor step's size from the rows of a size probe of ``step`` (the step
        just before the window), and say it before any tensor is written."""
        nbytes, count = tensor_bytes(rows, wants, place_views=self.place_views)
        self._say_estimate(nbytes, count, f"measured on step {step}, just before the window",
                           f"size probe of step {step}, before the window")

    def before_start(self, source: Source | None, selected: Callable[[str, str, str], bool]) -> None:
        """At start, before any tensor is written: the estimate from ``estimate_from``'s records
        (``selected``: the scope/ops/phases filter, (module, op, phase) -> bool); or, for a
        window opening at step 0, that its size cannot be measured in advance and the fixes."""
        if self.estimate is not None or not (self.every or self.tensor_ops is not None):
            return  # suspects: estimated from the first pass already
        if source is not None:
            def wants(op: str, module: str, phase: str, call: int) -> bool:
                return selected(module, op, phase) and self.wants(source.step, phase, module, op, call)

            nbytes, count = tensor_bytes(source.rows, wants, self.place_views, source.views_known, selected)
            where = f"records of {source.path} step {source.step}"
            self._say_estimate(nbytes, count, f"from the {where}{source.differs}", where)
        elif self.selected_steps is None or 0 in self.selected_steps:
            msg = (f"opscope dump: the size of the full tensors of step 0 on rank {self.rank} cannot be measured "
                   "in advance (no earlier step to probe); it is measured while step 0 is written. To know it "
                   "before: estimate_from=<a statistics dump of this model> (e.g. from a cheap run with "
                   'data="statistics", steps=0), or start the window at step 1 or later (the step before is '
                   "then probed); or cap it with tensor_limit_mb")
            _say(msg, warn=self.limit is None)

    def _say_estimate(self, nbytes: int, count: int, how: str, basis: str) -> None:
        steps = None if self.selected_steps is None else len(self.selected_steps)
        total = f"; the {steps} selected steps will hold about {human(nbytes * steps)}" if steps and steps > 1 else ""
        msg = (f"opscope dump: about {human(nbytes)} of full tensors per step on rank {self.rank} ({count} tensors, "
               f"{how}){total}. {_FIX}")
        self.estimate = {"basis": basis, "bytes_per_step": nbytes, "tensors_per_step": count, "message": msg}
        _say(msg, warn=True)  # said before the first tensor is written, whatever the size

    def finish(self, manifest: dict[str, Any]) -> None:
        """Put sizes, the estimate and where the limit stopped capture into the manifest."""
        manifest["tensor_capture"] = {
            "limit_mb": self.limit_mb,
            "stored_bytes": self.stored,
            "bytes_per_step": {str(s): b for s, (b, _) in sorted(self.step_bytes.items())},
            "estimate": None if self.estimate is None else {k: v for k, v in self.estimate.items() if k != "message"},
            "stopped": self.stopped,
            "suspect_calls": None if self.keys is None else len(self.keys),
        }
        manifest["notes"] = [*manifest.get("notes", []), *self.notes]

    def _stop(self, nbytes: int, where: tuple[Any, ...]) -> None:
        step, phase, module, op, io, slot = where
        self.stopped = {"step": step, "phase": phase, "module": module, "op": op, "io": io, "slot": slot,
                        "stored_bytes": self.stored}
        msg = (f"tensor capture stopped at the limit tensor_limit_mb={self.limit_mb:g} "
               f"({human(self.stored)} stored, the next tensor {human(nbytes)}): rank {self.rank}, step {step}, "
               f"{phase}, {module or '(top level)'} {op} {io} {slot}; later records hold statistics only")
        self.notes.append(msg)
        _say(f"opscope dump: {msg}", warn=True)


def read_source(cfg: DumpConfig, rank: int) -> Source | None:
    """The records ``estimate_from`` names, for this rank: the first selected step present
    there, else its first step. None (with a warning) when that dump lacks this rank.

    Raises:
        ConfigError: no readable opscope dump at that path.
    """
    from opscope.storage.reader import load

    path = cfg.estimate_from
    if path is None:  # estimate_from unset: there is nothing to read
        return None
    fix = ('give the directory of an earlier dump of this model (e.g. from a cheap run with '
           'data="statistics", steps=0), or leave estimate_from unset')
    try:
        dump = load(path)
        steps = dump.steps(rank)
        if not steps:
            _say(f"opscope dump: estimate_from={path!r} holds no step of rank {rank}: no estimate from it "
                 "(the size is measured as without estimate_from)", warn=True)
            return None
        selected = cfg.steps.steps
        step = min((s for s in steps if selected is None or s in selected), default=steps[0])
        table = dump.records(rank=rank, step=step,
                             columns=["id", "phase", "module", "op", "call", "io", "dtype", "shape",
                                                             "numel", "producer", "note", "view"])
    except (DumpFormatError, OSError) as exc:
        raise ConfigError(f"estimate_from: {path!r} is not a readable opscope dump ({exc}); {fix}") from None
    if dump.problems and not table.num_rows:
        raise ConfigError(f"estimate_from: {path!r}: {dump.problems[-1]}; {fix}")
    inputs, outputs = cfg.mode in ("input", "all"), cfg.mode in ("output", "all")
    rows = [r for r in table_rows(table) if (outputs if r[_IO] == "output" else inputs)]
    return Source(str(path), step, rows, places_views(dump.manifest), differs(dump.manifest.get("config") or {}, cfg))


def load_suspects(summary: str, rank: int) -> tuple[frozenset[CallKey], dict[str, Any]]:
    """The (step, phase, module, op, call) keys of this rank's culprits and their producers,
    and the size estimate from the first pass's records."""
    doc = _read_summary(summary)
    keys: set[CallKey] = set()
    culprits = [c for c in doc.get("culprits") or [] if c.get("kind") == "culprit" and c.get("calls")]
    if not culprits:
        raise ConfigError(f"suspects: {summary!r} lists no culprit with its calls (nothing diverged, only "
                          "roots, or a summary from an older opscope): nothing to capture in full")
    mine = [c for c in culprits if int(c.get("rank", 0)) == rank]
    for c in mine:
        for side in c["calls"].values():
            for phase, module, op, call in side.get("capture") or []:
                keys.add((int(c["step"]), phase, module or "", op, int(call if call is not None else -1)))
    return frozenset(keys), _estimate(doc, summary, keys, rank, len(mine))


def _read_summary(summary: str) -> dict[str, Any]:
    try:
        doc = json.loads(Path(summary).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"suspects: cannot read {summary!r} ({exc})") from None
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith("opscope.compare.summary/"):
        raise ConfigError(f"suspects: {summary!r} is not an opscope compare summary.json")
    return doc


def _estimate(doc: dict[str, Any], summary: str, keys: set[CallKey], rank: int, culprits: int) -> dict[str, Any]:
    per_step: dict[int, int] = {}
    basis = None
    for side in ("target", "reference"):
        try:
            per_step = _first_pass_bytes(doc.get(side) or "", keys, rank)
            basis = f"the first-pass records of {doc.get(side)}"
            break
        except Exception:  # a moved or partial first-pass dump: the estimate is only advice
            continue
    steps = sorted({k[0] for k in keys})
    if basis is None:
        size = "size unknown (the first-pass dumps named in the summary are not readable)"
    else:
        size = "; ".join(f"about {human(per_step.get(s, 0))} at step {s}" for s in steps) or "nothing"
    msg = (f"opscope dump: two-pass capture from {summary}: full tensors for {culprits} culprits "
           f"({len(keys)} op calls with their input producers) on rank {rank}: {size}"
           f"{f' (from {basis})' if basis else ''}; statistics for everything else")
    return {"basis": basis or "unknown", "bytes_per_step": {str(s): per_step.get(s, 0) for s in steps},
            "message": msg}


def _first_pass_bytes(path: str, keys: set[CallKey], rank: int) -> dict[int, int]:
    """numel x dtype size of the rows that will hold a tensor: outputs (views included: with
    suspects they are stored in their own layout), and inputs seen first."""
    from opscope.storage.reader import load

    dump = load(path)
    out: dict[int, int] = {}
    cols = ["step", "phase", "module", "op", "call", "io", "producer", "numel", "dtype"]
    for step in sorted({k[0] for k in keys}):
        for r in dump.records(rank=rank, step=step, columns=cols).to_pylist():
            key = (step, r["phase"], r["module"] or "", r["op"], r["call"] if r["call"] is not None else -1)
            if key in keys and (r["io"] == "output" or r["producer"] is None):
                out[step] = out.get(step, 0) + int(r["numel"] or 0) * ITEMSIZE.get(r["dtype"], 4)
    return out


def _say(msg: str, warn: bool) -> None:
    LOG.info(msg)
    if warn:
        warnings.warn(msg, TensorDumpSize, stacklevel=_user_level())


def _user_level() -> int:
    """The ``stacklevel`` that names the user's line (the first frame outside opscope)."""
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    frame: FrameType | None = sys._getframe(2)
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level
