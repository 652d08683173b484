"""The ``dump`` section: :class:`DumpConfig` and :func:`dump_config` (docs/dump.md)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opscope.config.files import build, section_of
from opscope.config.values import (
    Filter,
    StepSelection,
    parse_bool,
    parse_choice,
    parse_number,
    parse_path,
    parse_ranks,
)
from opscope.errors import ConfigError

# recompute: the forward that activation checkpointing runs again inside the backward (its
# rows are recorded where backward is selected)
PHASES = ("forward", "backward", "optimizer", "recompute")
# The phases' codes in the native observers (enum Phase in capture/torch/native/_c/observer.h).
PHASE_CODES = {phase: code for code, phase in enumerate(PHASES)}
MODES = ("input", "output", "all")
LEVELS = ("module", "api", "aten")  # PyTorch's
# TensorFlow's levels (opscope.tensorflow.dump): a config file may name them too, so that
# `opscope run` and OPSCOPE_CONFIG accept a TensorFlow script's dump section as it is.
TF_LEVELS = ("op", "layer")
DATA = ("statistics", "tensor")


# Ascend DumpConfig / MindSpore dump spellings accepted as aliases of opscope keys.
DUMP_ALIASES = {
    "dump_path": "path",
    "dump_step": "steps",
    "iteration": "steps",
    "dump_mode": "mode",
    "kernels": "ops",
    "enable_dump": "enable",
}


@dataclass
class DumpConfig:
    """Everything ``opscope.dump`` accepts. See docs/dump.md for each key."""

    path: str = ""
    steps: StepSelection = field(default_factory=StepSelection)
    ranks: tuple[int, ...] | None = None
    mode: str = "all"
    level: str = "aten"
    data: str = "statistics"
    scope: Filter = field(default_factory=Filter)
    ops: Filter = field(default_factory=Filter)
    tensor_ops: Filter = field(default_factory=Filter)
    phases: tuple[str, ...] = PHASES
    source: bool = False
    overwrite: bool = False
    enable: bool = True
    queue_limit_mb: float = 512
    shard_mb: float = 256
    suspects: str | None = None  # a compare summary.json: full tensors for its culprits and their producers
    tensor_limit_mb: float | None = None  # stop storing tensors (never the run) past this many MB per rank
    estimate_from: str | None = None  # an earlier dump of this model: the tensor size is estimated from its records

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.to_json() if hasattr(value, "to_json") else value
        out["phases"] = list(self.phases)
        out["ranks"] = None if self.ranks is None else list(self.ranks)
        return out


def _phases(value: Any) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise ConfigError(f"phases: {value!r} is not a list; allowed items: {', '.join(PHASES)}")
    return tuple(parse_choice("phases", v, PHASES) for v in items)


_DUMP_PARSERS = {
    "path": lambda v: parse_path("path", v),
    "steps": StepSelection,
    "ranks": parse_ranks,
    "mode": lambda v: parse_choice("mode", v, MODES),
    "level": lambda v: parse_choice("level", v, LEVELS + TF_LEVELS),
    "data": lambda v: parse_choice("data", v, DATA),
    "scope": lambda v: Filter.parse("scope", v),
    "ops": lambda v: Filter.parse("ops", v),
    "tensor_ops": lambda v: Filter.parse("tensor_ops", v),
    "phases": _phases,
    "source": lambda v: parse_bool("source", v),
    "overwrite": lambda v: parse_bool("overwrite", v),
    "enable": lambda v: parse_bool("enable", v),
    "queue_limit_mb": lambda v: parse_number("queue_limit_mb", v, 1),
    "shard_mb": lambda v: parse_number("shard_mb", v, 1),
    "suspects": lambda v: _suspects(v),
    "tensor_limit_mb": lambda v: None if v is None else parse_number("tensor_limit_mb", v, 0),
    "estimate_from": lambda v: _estimate_from(v),
}


def _suspects(value: Any) -> str | None:
    """A compare ``-o`` directory or its summary.json, resolved to the summary.json path."""
    if value is None or value == "":
        return None
    path = Path(parse_path("suspects", value))
    summary = path / "summary.json" if path.is_dir() else path
    if not summary.is_file():
        raise ConfigError(f"suspects: {str(value)!r} has no summary.json; give the -o directory of "
                          "`opscope compare` (or its summary.json)")
    return str(summary)


def _estimate_from(value: Any) -> str | None:
    """An earlier opscope dump of the same model (any data mode): a directory with a manifest.
    It is read at start (:func:`opscope.capture.torch.suspects.read_source`)."""
    if value is None or value == "":
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigError(f"estimate_from: {value!r} is not a path; give the directory of an earlier dump of "
                          'this model, such as "dumps/stats"')
    path = Path(value)
    if not (path / "manifest.json").is_file():
        what = ("does not exist" if not path.exists() else "is a file, not a dump directory" if not path.is_dir()
                else "has no manifest.json: it is not an opscope dump")
        raise ConfigError(f"estimate_from: {str(value)!r} {what}; give the directory of an earlier dump of this "
                          'model (e.g. from a cheap run with data="statistics", steps=0)')
    return os.fspath(value)


def dump_config(config: str | os.PathLike | Mapping | None = None, **kwargs: Any) -> DumpConfig:
    """Resolve a :class:`DumpConfig` from a config file or mapping plus keyword overrides."""
    values = dict(section_of(config, "dump"))
    values.update({k: v for k, v in kwargs.items() if v is not None})
    cfg = build(DumpConfig, _DUMP_PARSERS, DUMP_ALIASES, "dump", values)
    if not cfg.path:
        raise ConfigError("dump: no path given; pass opscope.dump(\"dumps/run1\") or set \"path\" in the config")
    return cfg
