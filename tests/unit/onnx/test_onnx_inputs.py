"""inputs.npz conventions and the checks against the graph's inputs."""

from __future__ import annotations

import numpy as np
import pytest

from opscope.capture.onnxruntime.inputs import check_samples, load_samples
from opscope.errors import ConfigError

GRAPH = [("x", "tensor(float)", ["batch", 8]), ("mask", "tensor(bool)", [None, 8])]


def test_plain_names_are_one_step(tmp_path):
    np.savez(tmp_path / "in.npz", x=np.ones((2, 8), np.float32), mask=np.ones((2, 8), bool))
    samples = load_samples(tmp_path / "in.npz")
    assert len(samples) == 1 and set(samples[0]) == {"x", "mask"}
    check_samples(samples, GRAPH)


def test_sample_prefix_gives_one_step_per_sample_in_order(tmp_path):
    arrays = {f"sample{n}/x": np.full((1, 8), n, np.float32) for n in (10, 2, 0)}
    np.savez(tmp_path / "in.npz", **arrays)
    samples = load_samples(tmp_path / "in.npz")
    assert [float(s["x"][0, 0]) for s in samples] == [0.0, 2.0, 10.0]


def test_mixed_conventions_and_pickles_are_refused(tmp_path):
    np.savez(tmp_path / "mixed.npz", **{"sample0/x": np.ones(1), "x": np.ones(1)})
    with pytest.raises(ConfigError, match="mixes"):
        load_samples(tmp_path / "mixed.npz")
    np.savez(tmp_path / "obj.npz", x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ConfigError, match="object arrays"):
        load_samples(tmp_path / "obj.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match="not a readable .npz"):
        load_samples(tmp_path / "junk.npz")


@pytest.mark.parametrize(("sample", "message"), [
    ({"x": np.ones((2, 8), np.float32)}, r"missing \['mask'\]"),
    ({"x": np.ones((2, 8), np.float64), "mask": np.ones((2, 8), bool)}, "float64 but the model expects "
                                                                        "tensor\\(float\\)"),
    ({"x": np.ones((2, 9), np.float32), "mask": np.ones((2, 8), bool)}, r"shape \[2, 9\]"),
    ({"x": np.ones((2, 8), np.float32), "mask": np.ones((2, 8), bool), "y": np.ones(1)}, r"unknown \['y'\]"),
])
def test_bad_inputs_are_named(sample, message):
    with pytest.raises(ConfigError, match=message):
        check_samples([sample], GRAPH)
