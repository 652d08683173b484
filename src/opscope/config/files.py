"""Where configuration comes from: files (JSON, YAML, TOML), ``$OPSCOPE_CONFIG``, sections."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from opscope.config.env import env
from opscope.errors import ConfigError

SECTIONS = ("dump", "profile", "overflow", "monitor")


def load_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read a JSON, YAML or TOML config file into a dict, with a clear error on bad syntax."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist; check the path given to config= or OPSCOPE_CONFIG")
    text = p.read_text(encoding="utf-8")
    suffix = p.suffix.lower()
    if suffix == ".toml" and sys.version_info < (3, 11):
        raise ConfigError(f"config file {str(p)!r}: reading TOML needs Python 3.11 or newer (tomllib); "
                          "write the config as YAML or JSON")
    try:
        if suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        elif suffix == ".toml":
            data = _load_toml(text)
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


def build(cls: type, parsers: dict, aliases: dict, section: str, values: Mapping[str, Any]) -> Any:
    """``cls`` from ``values``: each key (or its alias) parsed by its parser; an unknown key names the allowed ones."""
    kwargs: dict[str, Any] = {}
    for raw_key, value in values.items():
        key = aliases.get(raw_key, raw_key)
        if key == "input_output":
            key, value = "mode", input_output(value)
            kwargs[key] = value
            continue
        if key not in parsers:
            allowed = sorted(set(parsers) | set(aliases))
            raise ConfigError(f"{section}: unknown key {raw_key!r}; allowed keys: {', '.join(allowed)}")
        kwargs[key] = parsers[key](value)
    return cls(**kwargs)


def input_output(value: Any) -> str:
    """MindSpore's ``input_output``: 0 = inputs and outputs, 1 = inputs, 2 = outputs."""
    table = {0: "all", 1: "input", 2: "output"}
    if value not in table:
        raise ConfigError(f"input_output: {value!r} is not allowed; allowed: 0 (all), 1 (input), 2 (output)")
    return table[value]


def _load_toml(text: str) -> Any:
    if sys.version_info >= (3, 11):  # the caller refused TOML on older Pythons
        import tomllib

        return tomllib.loads(text)
    raise AssertionError("unreachable: TOML was refused before parsing")
