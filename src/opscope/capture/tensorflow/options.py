"""The TensorFlow dump's options: the shared dump config plus its own levels."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opscope.config import dump_config, section_of
from opscope.errors import ConfigError

LEVELS = ("op", "layer")
# A config written for PyTorch names torch's levels: the nearest TensorFlow level.
_LEVEL_ALIASES = {"aten": "op", "api": "op", "module": "layer"}


def tf_level(level: str) -> str:
    """The TensorFlow level a config's ``level`` means (``aten`` -> ``op``, ``module`` -> ``layer``)."""
    return _LEVEL_ALIASES.get(level, level)


def resolve(config: Any, path: Any, keys: Mapping[str, Any]) -> tuple[Any, str]:
    """The :class:`~opscope.config.DumpConfig` and the TensorFlow level of a dump request."""
    values = dict(section_of(config, "dump"))
    values.update({k: v for k, v in keys.items() if v is not None})
    if path is not None:
        values["path"] = path
    level = values.pop("level", "op")
    level = _LEVEL_ALIASES.get(level, level) if isinstance(level, str) else level
    if level not in LEVELS:
        raise ConfigError(f"level: {level!r} is not a TensorFlow dump level; allowed: op (every op), "
                          "layer (Keras layer inputs/outputs and gradients)")
    return dump_config(values), level
