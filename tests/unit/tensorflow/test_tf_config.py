"""opscope.tensorflow's config: the seeds' DumpConfig spellings, levels, clear errors (no TF needed)."""

from __future__ import annotations

import json

import pytest

from opscope.errors import ConfigError
from opscope.tensorflow import resolve


def test_seed_keyword_names_are_accepted(tmp_path):
    cfg, level = resolve(None, None, {"enable_dump": True, "dump_path": str(tmp_path / "d"),
                                      "dump_step": "0|5|10", "dump_mode": "output"})
    assert cfg.path == str(tmp_path / "d") and cfg.mode == "output" and level == "op"
    assert 5 in cfg.steps and 4 not in cfg.steps and cfg.enable


def test_session_option_keys_in_a_config_file(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"dump": {"enable_dump": False, "dump_path": "dumps/x", "dump_step": 3,
                                         "dump_mode": "input", "level": "layer"}}))
    cfg, level = resolve(str(path), None, {})
    assert (cfg.enable, cfg.path, cfg.mode, level) == (False, "dumps/x", "input", "layer")
    assert 3 in cfg.steps and 0 not in cfg.steps


def test_torch_levels_map_to_the_nearest_tensorflow_level(tmp_path):
    assert resolve(None, tmp_path, {"level": "aten"})[1] == "op"
    assert resolve(None, tmp_path, {"level": "module"})[1] == "layer"


@pytest.mark.parametrize(("keys", "message"), [
    ({"level": "kernel"}, "not a TensorFlow dump level"),
    ({"dump_mode": "both"}, "mode"),
    ({"dump_step": "a|b"}, "allowed"),
    ({"enable_dump": "maybe"}, "enable"),
])
def test_bad_values_name_the_key_and_what_is_allowed(tmp_path, keys, message):
    with pytest.raises(ConfigError, match=message):
        resolve(None, tmp_path, keys)


def test_no_path_is_a_clear_error():
    with pytest.raises(ConfigError, match="no path"):
        resolve(None, None, {"dump_step": 0})
