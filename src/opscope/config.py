"""One validated configuration for dump, profile and overflow watch.

Sources, in order of precedence: keyword arguments, a config file (JSON, YAML or TOML)
passed as ``config=``, the file named by ``OPSCOPE_CONFIG``. Keys mirror the Ascend
DumpConfig / MindSpore dump settings where they exist (``dump_path``, ``dump_step``,
``dump_mode``, ``kernels``, ``iteration``, ``input_output``), so both spellings work.

Every bad key or value raises :class:`~opscope.errors.ConfigError` naming the key, the
value and what is allowed, before any capture starts.

Environment variables (all read here, nowhere else):

- ``OPSCOPE_CONFIG``: path of a config file used when no ``config=`` is given.
- ``OPSCOPE_STATS_BACKEND``: ``auto``/``c`` (one C pass on the training thread, default),
  ``async`` (the C pass on a worker thread) or ``torch`` (torch reductions, the device path).
- ``OPSCOPE_RUN_ID``: identifies one launch across its ranks (set by ``opscope run``).
- ``OPSCOPE_LAUNCHER``: set by ``opscope run`` for its command, which said what is on
  (a process started with ``OPSCOPE_CONFIG`` alone says it on rank 0).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opscope.config_types import (
    Filter,
    StepSelection,
    _bool,
    _choice,
    _number,
    _optional_str,
    _path,
    _ranks,
)
from opscope.errors import ConfigError

PHASES = ("forward", "backward", "optimizer")
# The phases' codes in the native observers (enum Phase in capture/torch/native/_c/observer.h).
PHASE_CODES = {phase: code for code, phase in enumerate(PHASES)}
MODES = ("input", "output", "all")
LEVELS = ("module", "api", "aten")
DATA = ("statistics", "tensor")
WATCH_ACTIONS = ("warn", "raise", "record")


def env(name: str, default: str | None = None) -> str | None:
    """Read one ``OPSCOPE_*`` environment option."""
    return os.environ.get(f"OPSCOPE_{name}", default)


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
    return tuple(_choice("phases", v, PHASES) for v in items)


def _input_output(value: Any) -> str:
    # MindSpore: 0 = inputs and outputs, 1 = inputs, 2 = outputs.
    table = {0: "all", 1: "input", 2: "output"}
    if value not in table:
        raise ConfigError(f"input_output: {value!r} is not allowed; allowed: 0 (all), 1 (input), 2 (output)")
    return table[value]


_DUMP_PARSERS = {
    "path": lambda v: _path("path", v),
    "steps": StepSelection,
    "ranks": _ranks,
    "mode": lambda v: _choice("mode", v, MODES),
    "level": lambda v: _choice("level", v, LEVELS),
    "data": lambda v: _choice("data", v, DATA),
    "scope": lambda v: Filter.parse("scope", v),
    "ops": lambda v: Filter.parse("ops", v),
    "tensor_ops": lambda v: Filter.parse("tensor_ops", v),
    "phases": _phases,
    "source": lambda v: _bool("source", v),
    "overwrite": lambda v: _bool("overwrite", v),
    "enable": lambda v: _bool("enable", v),
    "queue_limit_mb": lambda v: _number("queue_limit_mb", v, 1),
    "shard_mb": lambda v: _number("shard_mb", v, 1),
    "suspects": lambda v: _suspects(v),
    "tensor_limit_mb": lambda v: None if v is None else _number("tensor_limit_mb", v, 0),
    "estimate_from": lambda v: _estimate_from(v),
}


def _suspects(value: Any) -> str | None:
    """A compare ``-o`` directory or its summary.json, resolved to the summary.json path."""
    if value is None or value == "":
        return None
    path = Path(_path("suspects", value))
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


def _build(cls: type, parsers: dict, aliases: dict, section: str, values: Mapping[str, Any]) -> Any:
    kwargs: dict[str, Any] = {}
    for raw_key, value in values.items():
        key = aliases.get(raw_key, raw_key)
        if key == "input_output":
            key, value = "mode", _input_output(value)
            kwargs[key] = value
            continue
        if key not in parsers:
            allowed = sorted(set(parsers) | set(aliases))
            raise ConfigError(f"{section}: unknown key {raw_key!r}; allowed keys: {', '.join(allowed)}")
        kwargs[key] = parsers[key](value)
    return cls(**kwargs)


def dump_config(config: str | os.PathLike | Mapping | None = None, **kwargs: Any) -> DumpConfig:
    """Resolve a :class:`DumpConfig` from a config file or mapping plus keyword overrides."""
    values = dict(section_of(config, "dump"))
    values.update({k: v for k, v in kwargs.items() if v is not None})
    cfg = _build(DumpConfig, _DUMP_PARSERS, DUMP_ALIASES, "dump", values)
    if not cfg.path:
        raise ConfigError("dump: no path given; pass opscope.dump(\"dumps/run1\") or set \"path\" in the config")
    return cfg


@dataclass
class ProfileConfig:
    """Everything ``opscope.profile`` accepts (Ascend profiling_options keys). See docs/profile.md."""

    output: str = ""
    steps: StepSelection = field(default_factory=StepSelection)
    ranks: tuple[int, ...] | None = None
    training_trace: bool = True
    task_trace: bool = False
    fp_point: str | None = None
    bp_point: str | None = None
    record_shapes: bool = False
    with_stack: bool = False
    overwrite: bool = False
    enable: bool = True
    warmup: int = 1
    clock: str = "auto"
    merge_timeout: float = 120

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["steps"] = self.steps.to_json()
        out["ranks"] = None if self.ranks is None else list(self.ranks)
        return out


def _on_off(key: str, value: Any) -> bool:
    # Ascend profiling_options spell switches "on" / "off".
    if isinstance(value, str) and value.lower() in ("on", "off"):
        return value.lower() == "on"
    return _bool(key, value)


_PROFILE_PARSERS = {
    "output": lambda v: _path("output", v),
    "steps": StepSelection,
    "ranks": _ranks,
    "training_trace": lambda v: _on_off("training_trace", v),
    "task_trace": lambda v: _on_off("task_trace", v),
    "fp_point": lambda v: _optional_str("fp_point", v),
    "bp_point": lambda v: _optional_str("bp_point", v),
    "record_shapes": lambda v: _bool("record_shapes", v),
    "with_stack": lambda v: _bool("with_stack", v),
    "overwrite": lambda v: _bool("overwrite", v),
    "enable": lambda v: _bool("enable", v),
    "warmup": lambda v: int(_number("warmup", v, 0)),
    "clock": lambda v: _choice("clock", v, ("auto", "host", "cuda", "npu")),
    "merge_timeout": lambda v: _number("merge_timeout", v, 0),
}
PROFILE_ALIASES = {"profiling_mode": "enable", "path": "output"}


ASCEND_ONLY_PROFILE_KEYS = ("aicpu", "aic_metrics")  # Ascend AI Core/AI CPU counters: nothing to record here


def _profiling_options(values: dict[str, Any]) -> dict[str, Any]:
    """Ascend's ``profiling_options`` inside the profile section: a JSON string (as the seeds
    hand it to the session) or a mapping of profile keys; the section's own keys win.
    ``aicpu`` and ``aic_metrics`` are accepted and ignored."""
    options = values.pop("profiling_options", None)
    if isinstance(options, (str, bytes)):
        try:
            options = json.loads(options)
        except ValueError as exc:
            raise ConfigError(f"profile: profiling_options is not valid JSON ({exc}); give a JSON object such as "
                              '\'{"output": "prof/run1", "task_trace": "on"}\' or a mapping') from exc
    if options is not None and not isinstance(options, Mapping):
        raise ConfigError(f"profile: profiling_options must be a JSON object or a mapping of profile keys, not {options!r}")
    merged = {**(options or {}), **values}
    return {k: v for k, v in merged.items() if k not in ASCEND_ONLY_PROFILE_KEYS}


def profile_config(config: str | os.PathLike | Mapping | None = None, **kwargs: Any) -> ProfileConfig:
    """Resolve a :class:`ProfileConfig` from a config file or mapping plus keyword overrides."""
    values = _profiling_options(dict(section_of(config, "profile")))
    values.update({k: v for k, v in kwargs.items() if v is not None})
    cfg = _build(ProfileConfig, _PROFILE_PARSERS, PROFILE_ALIASES, "profile", values)
    if not cfg.output:
        raise ConfigError("profile: no output given; pass opscope.profile(\"prof/run1\") or set \"output\"")
    return cfg


@dataclass
class WatchConfig:
    """Everything ``opscope.watch`` accepts. See docs/overflow.md."""

    action: str = "raise"
    level: str = "aten"
    limit: float | None = None
    path: str | None = None
    history: int = 4
    loss_spike: float | None = None
    time_spike: float | None = None
    steps: StepSelection = field(default_factory=StepSelection)
    ranks: tuple[int, ...] | None = None
    enable: bool = True

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["steps"] = self.steps.to_json()
        out["ranks"] = None if self.ranks is None else list(self.ranks)
        return out


_WATCH_PARSERS = {
    "action": lambda v: _choice("action", v, WATCH_ACTIONS),
    "level": lambda v: _choice("level", v, ("module", "aten")),
    "limit": lambda v: None if v is None else _number("limit", v, 0),
    "path": lambda v: None if v is None else _path("path", v),
    "history": lambda v: int(_number("history", v, 1)),
    "loss_spike": lambda v: None if v is None else _number("loss_spike", v, 1),
    "time_spike": lambda v: None if v is None else _number("time_spike", v, 1),
    "steps": StepSelection,
    "ranks": _ranks,
    "enable": lambda v: _bool("enable", v),
}


def watch_config(config: str | os.PathLike | Mapping | None = None, **kwargs: Any) -> WatchConfig:
    """Resolve a :class:`WatchConfig` (the ``overflow`` section) plus keyword overrides."""
    values = dict(section_of(config, "overflow"))
    values.update({k: v for k, v in kwargs.items() if v is not None})
    return _build(WatchConfig, _WATCH_PARSERS, {}, "overflow", values)


SECTIONS = ("dump", "profile", "overflow")


def load_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read a JSON, YAML or TOML config file into a dict, with a clear error on bad syntax."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist; check the path given to config= or OPSCOPE_CONFIG")
    text = p.read_text(encoding="utf-8")
    suffix = p.suffix.lower()
    try:
        if suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        elif suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        else:
            data = json.loads(text)
    except Exception as exc:  # each parser raises its own type
        raise ConfigError(f"config file {str(p)!r} is not valid {suffix.lstrip('.') or 'JSON'}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a mapping of keys, not {type(data).__name__}")
    return data


def load(config: str | os.PathLike | Mapping | None = None) -> dict[str, Any]:
    """The whole config mapping: ``config`` (a path or mapping), else ``$OPSCOPE_CONFIG``, else {}."""
    if config is None:
        config = env("CONFIG")
        if not config:
            return {}
    data = dict(config) if isinstance(config, Mapping) else load_file(config)
    return data


def section_of(config: str | os.PathLike | Mapping | None, section: str) -> Mapping[str, Any]:
    """One section of a config. Flat files with only dump keys count as the dump section."""
    data = load(config)
    if not data:
        return {}
    if any(k in SECTIONS for k in data):
        unknown = [k for k in data if k not in SECTIONS]
        if unknown:
            raise ConfigError(f"config: unknown section {unknown[0]!r}; allowed sections: {', '.join(SECTIONS)}")
        value = data.get(section) or {}
        if not isinstance(value, Mapping):
            raise ConfigError(f"config: section {section!r} must be a mapping of keys, not {value!r}")
        return value
    return data if section == "dump" else {}
