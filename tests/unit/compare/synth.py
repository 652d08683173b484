"""Synthetic dumps for compare tests: a tiny numpy 'model' written with the real DumpWriter.

Rows follow the capture schema: one row per tensor, ops numbered by ``seq``, inputs naming
the output row that produced them (``producer``), statistics and a wsum64-v2 hash on every
row, full tensors on outputs and leaves when ``data="tensor"``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from opscope.model.hashing import ALGORITHM, content_hash
from opscope.model.records import new_row
from opscope.storage.writer import DumpWriter


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (nearest even), returned as uint16 bits."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


@dataclass
class T:
    """A tensor of the synthetic run: its value and the row id that produced it."""

    value: np.ndarray
    producer: int | None = None
    param: str | None = None
    dtype: str = "float32"


class Run:
    """Write one rank of a synthetic dump, op by op."""

    def __init__(self, path: str | Path, *, data: str = "tensor", rank: int = 0,
                 status: str = "complete", hash_algorithm: str = ALGORITHM,
                 hasher: Callable[[np.ndarray], int] = content_hash, run_id: str | None = None) -> None:
        # with a run_id, the ranks of one dump are written one after the other (without, each
        # replaces the dump, as a new run does)
        manifest = {"tool": "synth", "hash_algorithm": hash_algorithm, **({"run_id": run_id} if run_id else {})}
        self.writer = DumpWriter(path, rank, manifest, overwrite=run_id is None)
        self.writer.open()
        self.data, self.rank, self.status, self.hasher = data, rank, status, hasher
        self.step, self.next_id, self.seq = 0, 0, 0
        self.rows: list[list[Any]] = []
        self.calls: dict[tuple[str, str, str], int] = defaultdict(int)

    def leaf(self, value: Any, dtype: str = "float32", param: str | None = None) -> T:
        return T(cast(np.asarray(value), dtype), None, param, dtype)

    def op(self, op: str, inputs: list[T], outputs: list[np.ndarray], *, module: str = "",
           phase: str = "forward", dtype: str | None = None, source: str | None = None) -> list[T]:
        """Record one op call; returns its outputs as tensors (cast to ``dtype``)."""
        key = (phase, module, op)
        call = self.calls[key]
        self.calls[key] += 1
        common = dict(rank=self.rank, step=self.step, seq=self.seq, phase=phase, module=module, op=op,
                      call=call, device="cpu", source=source)
        for slot, t in enumerate(inputs):
            self._row(t.value, t.dtype, io="param" if t.param and phase == "optimizer" else "input",
                      slot=slot, producer=t.producer, param=t.param, store=t.producer is None, **common)
        outs = []
        for slot, value in enumerate(outputs):
            dt = dtype or (inputs[0].dtype if inputs else "float32")
            v = cast(np.asarray(value), dt)
            rid = self._row(v, dt, io="output", slot=slot, producer=None, param=None, store=True, **common)
            outs.append(T(v, rid, None, dt))
        self.seq += 1
        return outs

    def _row(self, value: np.ndarray, dtype: str, *, store: bool, **cols: Any) -> int:
        rid = self.next_id
        self.next_id += 1
        raw = to_bf16_bits(value) if dtype == "bfloat16" else np.ascontiguousarray(value)
        data = key = None
        if self.data == "tensor" and store:
            key = f"r{rid}"
            data = self.writer.add_tensor(self.step, key, dtype, list(value.shape), raw.tobytes(), raw.nbytes)
        row = new_row(id=rid, dtype=dtype, shape=list(value.shape), numel=int(value.size), data=data, key=key, **cols)
        row[-1] = stats(value.astype(np.float64), self.hasher(raw))
        self.rows.append(row)
        return rid

    def end_step(self) -> None:
        self.writer.add_rows(self.step, self.rows)
        self.writer.end_step(self.step)
        self.rows, self.seq = [], 0
        self.calls.clear()
        self.step += 1

    def close(self) -> None:
        if self.rows:
            self.end_step()
        self.writer.close(self.status)


def cast(value: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return from_bf16_bits(to_bf16_bits(value.astype(np.float32)))
    return value.astype(dtype)


def stats(v: np.ndarray, h: int) -> tuple[Any, ...]:
    finite = v[np.isfinite(v)]
    if finite.size == 0:
        finite = np.zeros(1)
    return (float(finite.min()), float(finite.max()), float(finite.mean()), float(finite.std()),
            float(np.sqrt(np.sum(finite * finite))), float(np.abs(finite).max()),
            int(np.isnan(v).sum()), int(np.isinf(v).sum()), int((v == 0).sum()), h)


# -- a tiny MLP-with-layernorm "model" in numpy ------------------------------------------------
def gelu(x: np.ndarray, approximate: bool = False) -> np.ndarray:
    from math import erf, pi, sqrt

    if approximate:
        return 0.5 * x * (1 + np.tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + np.vectorize(erf)(x / sqrt(2)))


def layer_norm(x: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps)


def mlp_run(path: str | Path, *, dtype: str = "float32", steps: int = 1, fault: str | None = None,
            data: str = "tensor", seed: int = 0, noise: float = 0.0, status: str = "complete",
            rank: int = 0) -> Path:
    """Forward of a 2-block MLP with layer norms, compute in ``dtype`` (float64 maths, cast).

    ``fault``: None | "gelu_tanh" | "ln_eps" | "insert_scale" | "insert_cast" | "param_row" |
    "nan" | "decompose_gelu".
    """
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal((8, 16))
    w1 = rng.standard_normal((16, 32)) * 0.25
    w2 = rng.standard_normal((32, 16)) * 0.25
    run = Run(path, data=data, rank=rank, status=status)
    jitter = np.random.default_rng(seed + 1)
    with np.errstate(over="ignore", invalid="ignore"):  # the "nan" fault overflows on purpose
        _forward(run, steps, fault, dtype, noise, jitter, x0, w1, w2)
    run.close()
    return Path(path)


def _forward(run: Run, steps: int, fault: str | None, dtype: str, noise: float, jitter: Any,
             x0: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> None:
    for _ in range(steps):
        w1_t = w1.copy()
        if fault == "param_row":
            w1_t[3] += 0.05
        x = run.leaf(x0, dtype)
        p1 = run.leaf(w1_t, dtype, param="fc1.weight")
        p2 = run.leaf(w2, dtype, param="fc2.weight")

        def val(a: np.ndarray) -> np.ndarray:
            return a * (1 + noise * jitter.standard_normal(a.shape)) if noise else a

        (h,) = run.op("aten.mm.default", [x, p1], [val(x.value.astype(np.float64) @ p1.value)], module="fc1")
        if fault in ("insert_scale", "insert_cast"):
            scale = 1.01 if fault == "insert_scale" else 1.0
            (h,) = run.op("aten.mul.Tensor", [h], [h.value * scale], module="act")
        if fault == "decompose_gelu":
            (a,) = run.op("aten.mul.Tensor", [h], [h.value / np.sqrt(2)], module="act")
            (b,) = run.op("aten.erf.default", [a], [np.vectorize(__import__("math").erf)(a.value)], module="act")
            (g,) = run.op("aten.mul.Tensor", [h, b], [0.5 * h.value * (1 + b.value)], module="act")
        else:
            (g,) = run.op("aten.gelu.default", [h], [val(gelu(h.value.astype(np.float64), fault == "gelu_tanh"))],
                          module="act", source="model.py:12 (forward)")
        gv = g.value.astype(np.float64)
        if fault == "nan":
            gv = gv * np.float32(1e38) * 10
        (o,) = run.op("aten.mm.default", [g, p2], [val(gv @ p2.value)], module="fc2")
        eps = 1e-2 if fault == "ln_eps" else 1e-5
        (n,) = run.op("aten.native_layer_norm.default", [o], [val(layer_norm(o.value.astype(np.float64), eps))],
                      module="norm")
        run.op("aten.sum.default", [n], [np.asarray(val(n.value.astype(np.float64)).sum())], module="")
        run.end_step()
