"""The optional mapping file: rename the target's modules, ops and parameters into the
reference's names, for comparisons across model versions or frameworks.

Format (YAML or JSON; every section optional)::

    modules:            # prefix renames, matched at "." boundaries, longest prefix first
      encoder.layers: blocks
      "": model         # "" renames the top level
    ops:                # exact op-name renames
      aten.gelu.default: aten.gelu.default
      torch.nn.functional.gelu: torch.nn.functional.gelu
    params:             # prefix renames of parameter names, like modules
      encoder.layers: blocks
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opscope.errors import ConfigError

SECTIONS = ("modules", "ops", "params")


@dataclass(frozen=True)
class Mapping:
    """Renames applied to the target's records before alignment."""

    modules: dict[str, str] = field(default_factory=dict)
    ops: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.modules or self.ops or self.params)

    def module(self, name: str | None) -> str | None:
        return _prefix(name, self.modules)

    def op(self, name: str | None) -> str | None:
        return self.ops.get(name, name) if name is not None else None

    def param(self, name: str | None) -> str | None:
        return _prefix(name, self.params)

    def to_dict(self) -> dict[str, dict[str, str]]:
        return {"modules": dict(self.modules), "ops": dict(self.ops), "params": dict(self.params)}


def _prefix(name: str | None, table: dict[str, str]) -> str | None:
    if name is None or not table:
        return name
    if name in table:
        return table[name]
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:cut])
        if head in table:
            new = table[head]
            rest = ".".join(parts[cut:])
            return f"{new}.{rest}" if new else rest
    if "" in table and table[""]:
        return f"{table['']}.{name}" if name else table[""]
    return name


def load_mapping(source: str | os.PathLike | dict[str, Any] | Mapping | None) -> Mapping:
    """Read a mapping from a YAML/JSON file, a dict, or return an empty one for None.

    Raises:
        ConfigError: the file is missing, unparsable, or has an unknown section.
    """
    if source is None:
        return Mapping()
    if isinstance(source, Mapping):
        return source
    if isinstance(source, dict):
        data: Any = source
    else:
        path = Path(source)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"mapping file {str(path)!r} cannot be read ({exc.strerror or exc})") from None
        data = _parse(text, path)
    if not isinstance(data, dict):
        raise ConfigError("a mapping must be an object with sections " + ", ".join(SECTIONS))
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"unknown mapping section(s) {unknown}; allowed: {list(SECTIONS)}")
    sections = {}
    for name in SECTIONS:
        table = data.get(name) or {}
        if not isinstance(table, dict):
            raise ConfigError(f"mapping section {name!r} must map names to names, got {type(table).__name__}")
        sections[name] = {str(k): str(v) for k, v in table.items()}
    return Mapping(**sections)


def _parse(text: str, path: Path) -> Any:
    try:
        if path.suffix.lower() == ".json":
            return json.loads(text)
        import yaml

        return yaml.safe_load(text)
    except Exception as exc:  # yaml and json raise several types
        raise ConfigError(f"mapping file {str(path)!r} is not valid {path.suffix or 'YAML'}: {exc}") from None
