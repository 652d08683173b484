import json

import pytest

from opscope.compare.mapping import load_mapping
from opscope.errors import ConfigError


def test_prefix_and_op_renames(tmp_path):
    path = tmp_path / "map.yaml"
    path.write_text("modules:\n  encoder.layers: blocks\nops:\n  aten.gelu.default: aten.silu.default\n")
    m = load_mapping(path)
    assert m.module("encoder.layers.0.fc1") == "blocks.0.fc1"
    assert m.module("encoder.layersX") == "encoder.layersX"
    assert m.op("aten.gelu.default") == "aten.silu.default"
    assert m.op("aten.mm.default") == "aten.mm.default"


def test_json_and_errors(tmp_path):
    good = tmp_path / "m.json"
    good.write_text(json.dumps({"params": {"enc": "dec"}}))
    assert load_mapping(good).param("enc.w") == "dec.w"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"modulez": {}}))
    with pytest.raises(ConfigError, match="unknown mapping section"):
        load_mapping(bad)
    with pytest.raises(ConfigError, match="cannot be read"):
        load_mapping(tmp_path / "missing.yaml")
