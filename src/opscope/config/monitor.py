"""The ``monitor`` section: :class:`MonitorConfig` and :func:`monitor_config` (docs/monitor.md)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from opscope.config.files import build, section_of
from opscope.config.values import (
    Filter,
    parse_bool,
    parse_number,
    parse_path,
    parse_ranks,
    parse_str_list,
)
from opscope.errors import ConfigError

# What the monitor can follow, in the order a step produces it.
TARGETS = ("inputs", "activations", "loss", "activation_grads", "grads", "lr", "optimizer", "weights")
DEFAULT_TARGETS = ("inputs", "loss", "grads", "lr")


@dataclass
class MonitorConfig:
    """Everything ``opscope.monitor`` accepts. See docs/monitor.md."""

    path: str = "opscope-monitor"
    every: int = 1
    targets: tuple[str, ...] = DEFAULT_TARGETS
    modules: Filter = field(default_factory=Filter)
    ranks: tuple[int, ...] | None = None
    window: int = 32
    threshold: float = 8.0
    warmup: int = 8
    move_decades: float = 2.0  # the smallest move of a norm that departs (squared kinds: twice)
    loss_rise: float = 0.25  # the smallest rise of the loss that departs, a fraction of its median
    chunk: int = 50
    report: bool = True
    overwrite: bool = False
    enable: bool = True
    tensorboard: bool | str = False  # True: PATH/tensorboard; a path: that folder (one run per rank)

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["targets"] = list(self.targets)
        out["modules"] = self.modules.to_json()
        out["ranks"] = None if self.ranks is None else list(self.ranks)
        return out


def parse_targets(value: Any) -> tuple[str, ...]:
    """``"grads"``, ``["grads", "optimizer"]`` or ``"all"`` -> targets in step order."""
    if value == "all":
        return TARGETS
    items = parse_str_list("targets", value)
    unknown = [v for v in items if v not in TARGETS]
    if unknown or not items:
        raise ConfigError(f"targets: {unknown[0] if unknown else value!r} is not a target; allowed: "
                          f"{', '.join(TARGETS)} or \"all\"")
    return tuple(t for t in TARGETS if t in items)


def _int(key: str, minimum: int) -> Any:
    def parse(value: Any) -> int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int):
            raise ConfigError(f"{key}: {value!r} is not an integer >= {minimum}")
        return int(parse_number(key, value, minimum))
    return parse


def _positive(key: str, example: str) -> Any:
    def parse(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            raise ConfigError(f"{key}: {value!r} is not a positive number; give one such as {example}")
        return float(value)
    return parse


_MONITOR_PARSERS = {
    "path": lambda v: parse_path("path", v),
    "every": _int("every", 1),
    "targets": parse_targets,
    "modules": lambda v: Filter.parse("modules", v),
    "ranks": parse_ranks,
    "window": _int("window", 4),
    "threshold": lambda v: parse_number("threshold", v, 1),
    "warmup": _int("warmup", 2),
    "move_decades": _positive("move_decades", "1.0 (a norm that moves 10x departs; default 2.0, 100x)"),
    "loss_rise": _positive("loss_rise", "0.1 (a loss 10% above its median departs; default 0.25)"),
    "chunk": _int("chunk", 1),
    "report": lambda v: parse_bool("report", v),
    "overwrite": lambda v: parse_bool("overwrite", v),
    "enable": lambda v: parse_bool("enable", v),
    "tensorboard": lambda v: parse_path("tensorboard", v) if isinstance(v, (str, os.PathLike))
    and str(v).lower() not in ("true", "false", "1", "0", "yes", "no") else parse_bool("tensorboard", v),
}
_MONITOR_ALIASES = {"output": "path", "dump_path": "path", "interval": "every", "module_patterns": "modules"}


def monitor_config(config: str | os.PathLike | Mapping | None = None, **kwargs: Any) -> MonitorConfig:
    """Resolve a :class:`MonitorConfig` (the ``monitor`` section) plus keyword overrides.

    Raises:
        ConfigError: an unknown key or a bad value, naming the key and what is allowed.
    """
    values = dict(section_of(config, "monitor"))
    values.update({k: v for k, v in kwargs.items() if v is not None})
    cfg = build(MonitorConfig, _MONITOR_PARSERS, _MONITOR_ALIASES, "monitor", values)
    if cfg.warmup >= cfg.window:
        raise ConfigError(f"monitor: warmup {cfg.warmup} must be below window {cfg.window} (the steps a band needs "
                          "before it judges, out of the steps it holds)")
    return cfg


def tensorboard_dir(cfg: MonitorConfig) -> str | None:
    """Where the TensorBoard scalars go (``PATH/tensorboard`` for ``true``), or None."""
    if isinstance(cfg.tensorboard, str):
        return cfg.tensorboard
    return os.path.join(cfg.path, "tensorboard") if cfg.tensorboard else None
