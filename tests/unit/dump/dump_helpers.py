from __future__ import annotations

import torch

import opscope
from opscope.demo.models import mlp_task, train_step, transformer_task


def train(path, n: int = 3, task=mlp_task, call_step: bool = True, **keys):
    """Train ``n`` steps of ``task`` under ``opscope.dump(path, **keys)``; returns (losses, Dump)."""
    model, opt, batch = task()
    losses = []
    session = opscope.dump(path, **keys)
    with session as d:
        for i in range(n):
            losses.append(train_step(model, opt, *batch(i)))
            if call_step:
                d.step()
    return losses, opscope.load(session.cfg.path)


def bare(steps: int = 3, task=mlp_task):
    model, opt, batch = task()
    return [train_step(model, opt, *batch(i)) for i in range(steps)]


def small_transformer():
    return transformer_task(d=32, heads=2, layers=1, seq=8, batch=2)


def small_mlp():
    return mlp_task(batch=8, d_in=16, hidden=16, depth=2)


def train_with(backend: str, monkeypatch, path, n: int = 2, task=small_mlp, **keys):
    """:func:`train` with ``OPSCOPE_DUMP_BACKEND=backend`` (``native`` or ``python``), from seed 0."""
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    torch.manual_seed(0)
    losses, dump = train(path, n, task, **keys)
    assert (dump.manifest["stats_backend"] == "native") == (backend == "native")
    return losses, dump


def calls(dump) -> dict:
    """Every row keyed by (step, phase, module, op base name, call count, io, slot): what a
    comparison lines up between a native and a Python dump. Autograd's own detach calls (seen
    by a Python mode only) and the spellings add/add_ are normalised."""
    from opscope.capture.torch.op_kinds import base_name

    out: dict = {}
    counts: dict = {}
    for row in sorted(dump.records().to_pylist(), key=lambda r: (r["step"], r["id"])):
        name = base_name(row["op"]).rstrip("_")
        if name == "detach":
            continue
        key = (row["step"], row["phase"], row["module"], name)
        if row["io"] in ("input", "param") and row["slot"] == 0:
            counts[key] = counts.get(key, -1) + 1
        out[(*key, counts.get(key, 0), row["io"], row["slot"])] = row
    return out


def dump_both(path, monkeypatch, backend, work) -> tuple[dict, dict]:
    """``work()`` dumped at the aten level (forward), natively and on the Python path: the rows of
    each (``path / name``) and the bytes the native statistics kernel was given while each ran."""
    rows, read = {}, {}
    for name in ("native", "python"):
        monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", name)
        with opscope.dump(path / name, level="aten", phases=["forward"]) as d:
            before = backend.read_bytes()
            work()
            d.step()
            read[name] = backend.read_bytes() - before
        rows[name] = opscope.load(path / name).records().to_pandas(integer_object_nulls=True)
    return rows, read


__all__ = ["bare", "calls", "dump_both", "small_mlp", "small_transformer", "torch", "train", "train_with",
           "transformer_task"]
