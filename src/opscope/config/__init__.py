"""One validated configuration for dump, profile and overflow watch.

Sources, in order of precedence: keyword arguments, a config file (JSON, YAML or TOML)
passed as ``config=``, the file named by ``OPSCOPE_CONFIG``. Keys mirror the Ascend
DumpConfig / MindSpore dump settings where they exist (``dump_path``, ``dump_step``,
``dump_mode``, ``kernels``, ``iteration``, ``input_output``), so both spellings work.

Every bad key or value raises :class:`~opscope.errors.ConfigError` naming the key, the
value and what is allowed, before any capture starts.

The package: :mod:`.values` (value types and the public parsers every section uses),
:mod:`.files` (files, ``$OPSCOPE_CONFIG``, sections), one module per section
(:mod:`.dump`, :mod:`.profile`, :mod:`.watch`, :mod:`.monitor`), and :mod:`.env`, the one place where
environment variables are read (each listed there with what it does).
"""

from __future__ import annotations

from opscope.config.dump import (
    DATA,
    DUMP_ALIASES,
    LEVELS,
    MODES,
    PHASE_CODES,
    PHASES,
    TF_LEVELS,
    DumpConfig,
    dump_config,
)
from opscope.config.env import FOREIGN, OPTIONS, env, foreign
from opscope.config.files import SECTIONS, build, load, load_file, section_of
from opscope.config.monitor import TARGETS, MonitorConfig, monitor_config
from opscope.config.profile import (
    ASCEND_ONLY_PROFILE_KEYS,
    PROFILE_ALIASES,
    ProfileConfig,
    profile_config,
)
from opscope.config.values import (
    Filter,
    StepSelection,
    parse_bool,
    parse_choice,
    parse_number,
    parse_optional_str,
    parse_path,
    parse_ranks,
    parse_steps,
    parse_str_list,
)
from opscope.config.watch import WATCH_ACTIONS, WatchConfig, watch_config

__all__ = [
    "ASCEND_ONLY_PROFILE_KEYS", "DATA", "DUMP_ALIASES", "FOREIGN", "LEVELS", "MODES", "OPTIONS", "PHASES",
    "PHASE_CODES", "PROFILE_ALIASES", "SECTIONS", "TF_LEVELS", "WATCH_ACTIONS", "DumpConfig", "Filter", "ProfileConfig",
    "MonitorConfig", "StepSelection", "TARGETS", "WatchConfig", "build", "dump_config", "env", "foreign", "load",
    "load_file", "parse_bool",
    "parse_choice", "parse_number", "parse_optional_str", "parse_path", "parse_ranks", "parse_steps",
    "parse_str_list", "monitor_config", "profile_config", "section_of", "watch_config",
]
