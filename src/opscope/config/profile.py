"""The ``profile`` section: :class:`ProfileConfig` and :func:`profile_config` (docs/profile.md)."""

from __future__ import annotations

import dataclasses
import json
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
    parse_optional_str,
    parse_path,
    parse_ranks,
)
from opscope.errors import ConfigError


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
    return parse_bool(key, value)


_PROFILE_PARSERS = {
    "output": lambda v: parse_path("output", v),
    "steps": StepSelection,
    "ranks": parse_ranks,
    "training_trace": lambda v: _on_off("training_trace", v),
    "task_trace": lambda v: _on_off("task_trace", v),
    "fp_point": lambda v: parse_optional_str("fp_point", v),
    "bp_point": lambda v: parse_optional_str("bp_point", v),
    "record_shapes": lambda v: parse_bool("record_shapes", v),
    "with_stack": lambda v: parse_bool("with_stack", v),
    "overwrite": lambda v: parse_bool("overwrite", v),
    "enable": lambda v: parse_bool("enable", v),
    "warmup": lambda v: int(parse_number("warmup", v, 0)),
    "clock": lambda v: parse_choice("clock", v, ("auto", "host", "cuda", "npu")),
    "merge_timeout": lambda v: parse_number("merge_timeout", v, 0),
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
        raise ConfigError(
            f"profile: profiling_options must be a JSON object or a mapping of profile keys, not {options!r}")
    merged = {**(options or {}), **values}
    return {k: v for k, v in merged.items() if k not in ASCEND_ONLY_PROFILE_KEYS}


def profile_config(config: str | os.PathLike | Mapping | None = None, **kwargs: Any) -> ProfileConfig:
    """Resolve a :class:`ProfileConfig` from a config file or mapping plus keyword overrides."""
    values = _profiling_options(dict(section_of(config, "profile")))
    values.update({k: v for k, v in kwargs.items() if v is not None})
    cfg = build(ProfileConfig, _PROFILE_PARSERS, PROFILE_ALIASES, "profile", values)
    if not cfg.output:
        raise ConfigError("profile: no output given; pass opscope.profile(\"prof/run1\") or set \"output\"")
    return cfg
