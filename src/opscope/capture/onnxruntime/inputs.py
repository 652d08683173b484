"""Model inputs for ``dump-onnx``: one step per sample set, checked against the graph.

An ``inputs.npz`` holds either

- one sample: arrays named after the graph inputs (``x``, ``attention_mask``) -> step 0; or
- several samples: arrays named ``sample<N>/<input>`` (``sample0/x``, ``sample1/x``) ->
  one step per ``N``, in increasing order of ``N``, numbered 0, 1, 2...

Write one with ``np.savez("inputs.npz", **{"sample0/x": a, "sample1/x": b})``. The file is
read with ``allow_pickle=False``: object arrays are refused. From Python, ``inputs`` may
also be a mapping (one sample) or a list of mappings (one per step).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from opscope.errors import ConfigError

_SAMPLE = re.compile(r"^sample(\d+)/(.+)$")

# ONNX tensor type string (as onnxruntime reports it) -> numpy dtype
ORT_TYPES = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16,
    "tensor(int8)": np.int8, "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32, "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_,
}


def load_samples(inputs: Any) -> list[dict[str, np.ndarray]]:
    """Sample sets from a ``.npz`` path, a mapping or a list of mappings (see module docstring)."""
    if isinstance(inputs, (str, os.PathLike)):
        return _from_npz(Path(inputs))
    if isinstance(inputs, Mapping):
        return [{str(k): np.asarray(v) for k, v in inputs.items()}]
    if isinstance(inputs, Sequence) and inputs and all(isinstance(s, Mapping) for s in inputs):
        return [{str(k): np.asarray(v) for k, v in s.items()} for s in inputs]
    raise ConfigError(f"inputs: {type(inputs).__name__} is not an .npz path, a mapping of input "
                      "name to array, or a list of such mappings (one per step)")


def _from_npz(path: Path) -> list[dict[str, np.ndarray]]:
    if not path.is_file():
        raise ConfigError(f"inputs file {str(path)!r} does not exist; give an .npz written with "
                          "np.savez(path, **{input_name: array})")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic[:2] != b"PK":
        raise ConfigError(f"inputs file {str(path)!r} is not a readable .npz (no zip header); "
                          "write it with np.savez(path, **{input_name: array})")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except ValueError as exc:
        raise ConfigError(f"inputs file {str(path)!r} holds object arrays, which are refused "
                          f"(no pickle): {exc}") from None
    except Exception as exc:  # zipfile.BadZipFile, OSError, EOFError...
        raise ConfigError(f"inputs file {str(path)!r} is not a readable .npz ({type(exc).__name__}: "
                          f"{exc}); write it with np.savez") from None
    if not arrays:
        raise ConfigError(f"inputs file {str(path)!r} holds no arrays")
    return split_samples(arrays, str(path))


def split_samples(arrays: dict[str, np.ndarray], where: str = "inputs") -> list[dict[str, np.ndarray]]:
    """Group ``sample<N>/<input>`` arrays into one mapping per sample; plain names are one sample."""
    matches = {name: _SAMPLE.match(name) for name in arrays}
    if not any(matches.values()):
        return [dict(arrays)]
    plain = [name for name, m in matches.items() if m is None]
    if plain:
        raise ConfigError(f"{where}: mixes per-sample arrays (sample<N>/<input>) with plain names "
                          f"{plain[:5]}; use one convention")
    samples: dict[int, dict[str, np.ndarray]] = {}
    for name, m in matches.items():
        assert m is not None  # names without a match were refused above
        samples.setdefault(int(m.group(1)), {})[m.group(2)] = arrays[name]
    return [samples[n] for n in sorted(samples)]


def check_samples(samples: list[dict[str, np.ndarray]], graph_inputs: list[tuple[str, str, list[Any]]]) -> None:
    """Raise :class:`ConfigError` naming every missing, unknown, wrongly typed or shaped input.

    Args:
        samples: one mapping per step.
        graph_inputs: ``(name, type string, shape)`` of each graph input, as onnxruntime
            reports them (dims are ints, or strings / None when symbolic).
    """
    expected = {name: (type_, shape) for name, type_, shape in graph_inputs}
    want = ", ".join(f"{n} {t} {s}" for n, (t, s) in expected.items())
    for step, sample in enumerate(samples):
        where = f"inputs (step {step})" if len(samples) > 1 else "inputs"
        missing = [n for n in expected if n not in sample]
        unknown = [n for n in sample if n not in expected]
        if missing or unknown:
            parts = []
            if missing:
                parts.append(f"missing {missing}")
            if unknown:
                parts.append(f"unknown {unknown}")
            raise ConfigError(f"{where}: {'; '.join(parts)}. The model's inputs are: {want}")
        for name, arr in sample.items():
            _check_one(where, name, arr, *expected[name])


def _check_one(where: str, name: str, arr: np.ndarray, type_: str, shape: list[Any]) -> None:
    dtype = ORT_TYPES.get(type_)
    if dtype is not None and arr.dtype != np.dtype(dtype):
        raise ConfigError(f"{where}: {name!r} is {arr.dtype} but the model expects {type_} "
                          f"({np.dtype(dtype).name}); convert it with .astype(np.{np.dtype(dtype).name})")
    if shape is None:
        return
    fixed = [d if isinstance(d, int) and d >= 0 else None for d in shape]
    if arr.ndim != len(fixed) or any(f is not None and f != a for f, a in zip(fixed, arr.shape)):
        shown = [d if d is not None else "?" for d in shape]
        raise ConfigError(f"{where}: {name!r} has shape {list(arr.shape)} but the model expects "
                          f"{shown} ('?' and names are free dimensions)")
