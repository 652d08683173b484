"""A config file may name TensorFlow's dump levels (op, layer): `opscope run` accepts it for a
TensorFlow script, and a PyTorch dump refuses it with the levels it has."""

from __future__ import annotations

import json

import pytest

import opscope
from opscope.autostart import describe, validate
from opscope.errors import ConfigError


@pytest.mark.parametrize("level", ["op", "layer"])
def test_the_launcher_accepts_tensorflow_levels_and_says_them(tmp_path, level):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"dump": {"path": str(tmp_path / "d"), "level": level, "dump_step": "0|2"}}))
    line = describe(validate(config))
    assert f"dump ({level}, statistics, steps 0,2)" in line


def test_a_pytorch_dump_refuses_a_tensorflow_level_naming_its_own(tmp_path):
    with pytest.raises(ConfigError, match="'op' is a TensorFlow level.*aten.*api.*module"):
        opscope.dump(tmp_path / "d", level="op")
    assert not (tmp_path / "d").exists()


def test_an_unknown_level_lists_every_framework_s_levels(tmp_path):
    with pytest.raises(ConfigError, match="allowed: module, api, aten, op, layer"):
        opscope.dump(tmp_path / "d", level="kernel")


def test_a_tensorflow_program_is_told_the_levels_it_gets(tmp_path):
    """The launcher speaks PyTorch's levels before it knows the program; a TensorFlow program's
    own line says op (an overflow watch is op level whatever the config says)."""
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"dump": {"path": str(tmp_path / "d"), "level": "module"},
                                  "overflow": {"action": "warn"}}))
    sections = validate(config)
    assert "overflow watch (aten, action warn" in describe(sections)
    line = describe(sections, "tensorflow")
    assert "dump (layer, statistics" in line and "overflow watch (op, action warn" in line
    assert "aten" not in line and "module" not in line
