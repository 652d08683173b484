"""The ``overflow`` section: :class:`WatchConfig` and :func:`watch_config` (docs/overflow.md)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from opscope.config.files import build, section_of
from opscope.config.values import (
    StepSelection,
    parse_bool,
    parse_choice,
    parse_number,
    parse_path,
    parse_ranks,
)

WATCH_ACTIONS = ("warn", "raise", "record")


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
    "action": lambda v: parse_choice("action", v, WATCH_ACTIONS),
    "level": lambda v: parse_choice("level", v, ("module", "aten")),
    "limit": lambda v: None if v is None else parse_number("limit", v, 0),
    "path": lambda v: None if v is None else parse_path("path", v),
    "history": lambda v: int(parse_number("history", v, 1)),
    "loss_spike": lambda v: None if v is None else parse_number("loss_spike", v, 1),
    "time_spike": lambda v: None if v is None else parse_number("time_spike", v, 1),
    "steps": StepSelection,
    "ranks": parse_ranks,
    "enable": lambda v: parse_bool("enable", v),
}


def watch_config(config: str | os.PathLike | Mapping | None = None, **kwargs: Any) -> WatchConfig:
    """Resolve a :class:`WatchConfig` (the ``overflow`` section) plus keyword overrides."""
    values = dict(section_of(config, "overflow"))
    values.update({k: v for k, v in kwargs.items() if v is not None})
    return build(WatchConfig, _WATCH_PARSERS, {}, "overflow", values)
