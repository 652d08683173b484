"""Value types and validators shared by every config section (see :mod:`opscope.config`); public so that every
section (and a framework adapter with its own keys) validates values the same way.

Each validator takes the key (for the message) and the value, and returns the parsed value
or raises :class:`~opscope.errors.ConfigError` naming the key, the value and what is allowed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from opscope.errors import ConfigError


class StepSelection:
    """Which steps to capture: ``"all"``, ``"0|5|10"``, ``"0-3"``, ``"0-3|8"``, an int or a list."""

    def __init__(self, spec: Any = "all") -> None:
        self.spec = spec
        self.steps: frozenset[int] | None = parse_steps(spec)

    def __contains__(self, step: int) -> bool:
        return self.steps is None or step in self.steps

    @property
    def last(self) -> int | None:
        """The last selected step, or None when every step is selected."""
        return None if self.steps is None else max(self.steps)

    def to_json(self) -> Any:
        return "all" if self.steps is None else sorted(self.steps)

    def __repr__(self) -> str:
        return f"StepSelection({self.spec!r})"


def parse_steps(spec: Any) -> frozenset[int] | None:
    allowed = 'allowed: "all", "0|5|10", "0-3", "0-3|8", an integer or a list of integers'
    if spec is None or (isinstance(spec, str) and spec.strip().lower() in ("all", "")):
        return None
    if isinstance(spec, bool):
        raise ConfigError(f"steps: {spec!r} is not a step selection ({allowed})")
    if isinstance(spec, int):
        items: list[Any] = [spec]
    elif isinstance(spec, str):
        items = [p.strip() for p in spec.replace(",", "|").split("|") if p.strip()]
    elif isinstance(spec, Iterable):
        items = list(spec)
    else:
        raise ConfigError(f"steps: {spec!r} is not a step selection ({allowed})")
    steps: set[int] = set()
    for item in items:
        steps.update(_parse_step_item(item, spec, allowed))
    if not steps:
        raise ConfigError(f"steps: {spec!r} selects no step ({allowed})")
    return frozenset(steps)


def _parse_step_item(item: Any, spec: Any, allowed: str) -> range | list[int]:
    try:
        if isinstance(item, int) and not isinstance(item, bool):
            if item < 0:
                raise ValueError
            return [item]
        text = str(item).strip()
        if "-" in text:
            lo, hi = (int(p) for p in text.split("-", 1))
            if lo < 0 or hi < lo:
                raise ValueError
            return range(lo, hi + 1)
        value = int(text)
        if value < 0:
            raise ValueError
        return [value]
    except ValueError:
        raise ConfigError(f"steps: {item!r} in {spec!r} is not a step or range ({allowed})") from None


@dataclass
class Filter:
    """Include/exclude globs: ``["encoder.*", "!encoder.layers.1.*"]``; empty includes all."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    @classmethod
    def parse(cls, key: str, value: Any) -> Filter:
        if value is None:
            return cls()
        if isinstance(value, str):
            value = [value]
        if isinstance(value, Mapping):
            unknown = set(value) - {"include", "exclude"}
            if unknown:
                raise ConfigError(f"{key}: unknown keys {sorted(unknown)}; allowed: include, exclude")
            include = parse_str_list(f"{key}.include", value.get("include", []))
            exclude = parse_str_list(f"{key}.exclude", value.get("exclude", []))
            return cls(tuple(include), tuple(exclude))
        items = parse_str_list(key, value)
        return cls(tuple(p for p in items if not p.startswith("!")), tuple(p[1:] for p in items if p.startswith("!")))

    def __bool__(self) -> bool:
        return bool(self.include or self.exclude)

    def matches(self, name: str) -> bool:
        from fnmatch import fnmatchcase

        if self.include and not any(fnmatchcase(name, p) for p in self.include):
            return False
        return not any(fnmatchcase(name, p) for p in self.exclude)

    def to_json(self) -> dict[str, list[str]]:
        return {"include": list(self.include), "exclude": list(self.exclude)}


def parse_str_list(key: str, value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{key}: {value!r} is not a list of glob patterns (e.g. [\"encoder.*\", \"!*.dropout\"])")
    return list(value)


def parse_choice(key: str, value: Any, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value.lower() not in allowed:
        raise ConfigError(f"{key}: {value!r} is not allowed; allowed: {', '.join(allowed)}")
    return value.lower()


def parse_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ConfigError(f"{key}: {value!r} is not a boolean; allowed: true, false")


def parse_number(key: str, value: Any, minimum: float = 0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise ConfigError(f"{key}: {value!r} is not a number >= {minimum}")
    return value


def parse_ranks(value: Any) -> tuple[int, ...] | None:
    if value is None or value == "all":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if isinstance(value, str):
        value = [v for v in value.replace(",", "|").split("|") if v.strip()]
    try:
        ranks = tuple(int(v) for v in value)
        if any(r < 0 for r in ranks) or any(isinstance(v, bool) for v in value):
            raise ValueError
    except (TypeError, ValueError):
        raise ConfigError(f"ranks: {value!r} is not a list of ranks (e.g. [0] or \"0|7\"), or \"all\"") from None
    return ranks


def parse_path(key: str, value: Any) -> str:
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise ConfigError(f"{key}: {value!r} is not a path; give a directory such as \"dumps/run1\"")
    return os.fspath(value)


def parse_optional_str(key: str, value: Any) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{key}: {value!r} is not a module path (e.g. \"encoder\") or null")
    return value
