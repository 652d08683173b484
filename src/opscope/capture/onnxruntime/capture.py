"""``dump_onnx``: every intermediate tensor of an ONNX graph under ONNX Runtime, as an opscope dump.

How it runs:

1. The model is loaded (the file is never modified). With ``opt_level`` above ``disable``,
   ONNX Runtime optimises it first and the graph it would run is saved and read back, so
   the dump holds the fused nodes ORT really executes.
2. Each node's inputs and outputs are planned as rows (:mod:`.plan`); module paths come
   from the exporter's scopes (:mod:`.scopes`).
3. The node outputs to capture are made graph outputs of a copy of the model and fetched
   by running it with optimisations off. To bound memory, they are split into runs whose
   outputs fit in ``memory_limit_mb`` (sizes from shape inference with the sample's
   shapes); each run recomputes the graph and hands its tensors to the writer at once.
4. Statistics are computed in float64 with numpy; with ``data="tensor"`` each tensor is
   stored once per step and every row that reads it points to that copy.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from opscope.capture.onnxruntime import graph as g
from opscope.capture.onnxruntime.inputs import check_samples, load_samples
from opscope.capture.onnxruntime.plan import Plan, is_parameter_name, plan_rows
from opscope.capture.onnxruntime.scopes import ScopedNode, resolve_modules
from opscope.capture.onnxruntime.stats import dtype_name, tensor_stats
from opscope.config import DATA, MODES, Filter, parse_choice
from opscope.errors import ConfigError
from opscope.model.hashing import ALGORITHM as HASH_ALGORITHM
from opscope.model.records import new_row
from opscope.storage.format import STD_METHOD
from opscope.storage.safetensors_io import DTYPES


@dataclass
class _Value:
    dtype: str
    shape: list[int]
    numel: int
    stats: tuple[Any, ...]
    data: str | None = None
    key: str | None = None
    note: str | None = None


_MISSING = _Value("unknown", [], 0, (None,) * 10)


def dump_onnx(model: Any, inputs: Any, path: str, *, provider: str | None = None,
              opt_level: str | None = None, data: str = "tensor", mode: str = "all",
              ops: Any = None, scope: Any = None, overwrite: bool = False,
              memory_limit_mb: float = 1024, modules: Any = None,
              command: list[str] | None = None) -> Any:
    """Run an ONNX model under ONNX Runtime and dump every node's inputs and outputs.

    Args:
        model: path of an ``.onnx`` file, its bytes, or an ``onnx.ModelProto``.
        inputs: an ``.npz`` path, a mapping input name -> array (one step), or a list of
            such mappings (one step each). See :mod:`.inputs` for the ``.npz`` layout.
        path: the dump directory.
        provider: execution provider (``cpu``, ``cuda``, ``CUDAExecutionProvider``...);
            CPU by default, and CPU also runs what the chosen provider cannot.
        opt_level: ``disable`` (default: the graph as written in the file), ``basic``,
            ``extended`` or ``all`` (the graph ONNX Runtime rewrites at that level).
        data: ``tensor`` (default; full tensors plus statistics) or ``statistics``.
        mode: ``all`` (default), ``input`` or ``output`` rows.
        ops: globs on op (``onnx::Gemm``), op type (``Gemm``) or node name; ``!`` excludes.
        scope: globs on the module path (``layers.0.*``).
        overwrite: replace an existing dump at ``path``.
        memory_limit_mb: bytes of captured outputs held at once; more means several runs.
        modules: ``named_modules()`` names (or the ``torch.nn.Module``) to settle
            ambiguous TorchScript scope names.
        command: recorded in the manifest (default ``sys.argv``).

    Returns:
        The written dump, as :class:`opscope.Dump`.
    """
    opts = _options(provider, opt_level, data, mode, ops, scope, memory_limit_mb)
    onnx, ort = g.require_onnx()
    original = g.load_model(model)
    samples = load_samples(inputs)
    runnable = g.optimize(original, opts["providers"], opts["opt_level"])
    probe = g.session(runnable, opts["providers"])
    check_samples(samples, [(i.name, i.type, i.shape) for i in probe.get_inputs()])
    del probe
    nodes = g.nodes_of(runnable)
    scopes = resolve_modules(
        [ScopedNode(n.name, n.op_type, n.inputs, n.outputs, n.metadata) for n in nodes],
        original=None if runnable is original else
        [ScopedNode(n.name, n.op_type, n.inputs, n.outputs, n.metadata) for n in g.nodes_of(original)],
        known=_module_names(modules))
    initializers = {i.name: i for i in runnable.graph.initializer}
    plan = plan_rows(nodes, scopes, set(initializers), set(g.graph_inputs(runnable)),
                     mode=opts["mode"], ops=opts["ops_filter"], scope=opts["scope_filter"],
                     param_names=_param_names(modules, original))
    manifest = _manifest(onnx, ort, original, opts, command, model)
    from opscope.storage.writer import DumpWriter

    writer = DumpWriter(path, 0, manifest, overwrite=overwrite)
    writer.open()
    try:
        _capture(writer, runnable, plan, samples, initializers, opts)
    except BaseException as exc:
        writer.close("crashed", error=f"{type(exc).__name__}: {exc}")
        raise
    writer.close("complete")
    writer.check()
    from opscope.storage.reader import load

    return load(path)


def _options(provider: str | None, opt_level: str | None, data: str, mode: str, ops: Any,
             scope: Any, memory_limit_mb: float) -> dict[str, Any]:
    if isinstance(memory_limit_mb, bool) or not isinstance(memory_limit_mb, (int, float)) or memory_limit_mb <= 0:
        raise ConfigError(f"memory_limit_mb: {memory_limit_mb!r} is not a positive number of MiB")
    ops_filter, scope_filter = Filter.parse("ops", ops), Filter.parse("scope", scope)
    return {
        "provider": provider, "providers": g.resolve_provider(provider),
        "opt_level": g.check_opt_level(opt_level), "data": parse_choice("data", data, DATA),
        "mode": parse_choice("mode", mode, MODES), "ops": ops_filter.to_json(), "scope": scope_filter.to_json(),
        "ops_filter": ops_filter, "scope_filter": scope_filter, "memory_limit_mb": memory_limit_mb,
    }


def _module_names(modules: Any) -> set[str] | None:
    if modules is None:
        return None
    if hasattr(modules, "named_modules"):
        return {name for name, _ in modules.named_modules()}
    if isinstance(modules, Iterable) and not isinstance(modules, (str, bytes)):
        return {str(m) for m in modules}
    raise ConfigError("modules: give a torch.nn.Module or a list of its named_modules() names")


def _param_names(modules: Any, original: Any) -> set[str]:
    """PyTorch parameter names: the module's own when given, else the exported file's
    initializers whose names look like parameters (optimiser-made ones never count)."""
    if hasattr(modules, "named_parameters"):
        names = {n for n, _ in modules.named_parameters()}
        return names | {n for n, _ in modules.named_buffers()}
    return {i.name for i in original.graph.initializer if is_parameter_name(i.name)}


def _device(providers: list[str]) -> str:
    first = providers[0]
    if first == "CPUExecutionProvider":
        return "cpu"
    if first in ("CUDAExecutionProvider", "TensorrtExecutionProvider"):
        return "cuda:0"
    return first.removesuffix("ExecutionProvider").lower()


def _manifest(onnx: Any, ort: Any, model: Any, opts: dict[str, Any], command: list[str] | None,
              source: Any) -> dict[str, Any]:
    import platform

    from opscope._version import __version__

    config = {k: v for k, v in opts.items() if not k.endswith("_filter")}
    return {
        "tool": {"name": "opscope", "version": __version__},
        "framework": {"onnxruntime": ort.__version__, "onnx": onnx.__version__},
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "command": list(sys.argv if command is None else command),
        "config": config,
        "device": _device(opts["providers"]),
        "provider": opts["providers"][0],
        "providers": opts["providers"],
        "run_id": None,
        "hash_algorithm": HASH_ALGORITHM,
        "std": STD_METHOD,
        "level": "onnx",
        "model": {
            "path": source if isinstance(source, str) else getattr(source, "__fspath__", lambda: None)(),
            "producer": f"{model.producer_name} {model.producer_version}".strip(),
            "opset": {(o.domain or "ai.onnx"): o.version for o in model.opset_import},
            "ir_version": model.ir_version,
            "graph": model.graph.name,
            "nodes": len(model.graph.node),
        },
    }


def _capture(writer: Any, model: Any, plan: Plan, samples: list[dict[str, np.ndarray]],
             initializers: Mapping[str, Any], opts: dict[str, Any]) -> None:
    from onnx import numpy_helper

    keep_data = opts["data"] == "tensor"
    owners = {r.value: r.owner for r in plan.rows}
    values: list[dict[str, _Value]] = [{} for _ in samples]
    stride = len(plan)

    def record(step: int, name: str, arr: np.ndarray, stats: tuple[Any, ...] | None = None) -> None:
        arr = np.asarray(arr)
        value = _Value(dtype_name(arr), [int(d) for d in arr.shape], int(arr.size),
                       tensor_stats(arr) if stats is None else stats)
        if keep_data and value.dtype in DTYPES:
            value.key = f"r{step * stride + owners[name]}"
            buffer = np.ascontiguousarray(arr.view(np.uint16) if value.dtype == "bfloat16" else arr)
            value.data = writer.add_tensor(step, value.key, value.dtype, value.shape, buffer, buffer.nbytes)
        values[step][name] = value

    param_stats: dict[str, tuple[Any, ...]] = {}
    for step, sample in enumerate(samples):
        for name in plan.feeds:
            record(step, name, sample[name])
        for name in plan.params:
            arr = numpy_helper.to_array(initializers[name])
            if name not in param_stats:
                param_stats[name] = tensor_stats(arr)
            record(step, name, arr, param_stats[name])
    if plan.fetch:
        sizes = g.estimate_bytes(model, samples[0], plan.fetch)
        for names in g.batches(plan.fetch, sizes, int(opts["memory_limit_mb"] * (1 << 20))):
            session = g.session(g.exposed(model, names), opts["providers"])
            for step, sample in enumerate(samples):
                try:
                    outputs = session.run(names, sample)
                except Exception as exc:
                    raise g.run_error(exc) from None
                for name, arr in zip(names, outputs):
                    record(step, name, arr)
                del outputs
            del session
    _check_unperturbed(writer, model, plan, samples, values, opts)
    device = _device(opts["providers"])
    for step in range(len(samples)):
        writer.add_rows(step, _rows(plan, values[step], step, device))
        writer.end_step(step)


def _check_unperturbed(writer: Any, model: Any, plan: Plan, samples: list[dict[str, np.ndarray]],
                       values: list[dict[str, _Value]], opts: dict[str, Any]) -> None:
    """Run the graph as is once per step: captured graph outputs must equal a plain session's.

    Exposing every value can change what ONNX Runtime computes (on CPU it runs float16 ops
    in float32 and skips the rounding between them unless a value is a graph output); such
    outputs get a note and the manifest a warning, rather than a silently different run.
    """
    names = [v.name for v in model.graph.output if v.name in plan.fetch]
    if not names:
        return
    session = g.session(model, opts["providers"])
    for step, sample in enumerate(samples):
        try:
            outputs = session.run(names, sample)
        except Exception as exc:
            raise g.run_error(exc) from None
        for name, arr in zip(names, outputs):
            if tensor_stats(np.asarray(arr))[9] != values[step][name].stats[9]:
                message = (f"step {step}: graph output {name!r} differs from a plain ONNX Runtime "
                           "session's: exposing the intermediate values changed the computation "
                           "(e.g. float16 ops run in float32 on CPU); see docs/onnx.md")
                with writer.editing_manifest() as manifest:
                    manifest.setdefault("warnings", []).append(message)
                values[step][name].note = "differs from a plain session's output (capture perturbed the run)"


def _rows(plan: Plan, values: dict[str, _Value], step: int, device: str) -> list[list[Any]]:
    base = step * len(plan)
    rows = []
    for r in plan.rows:
        v = values.get(r.value) or _MISSING
        rows.append(new_row(
            id=base + r.local, rank=0, step=step, seq=r.seq, phase="forward", module=r.module,
            op=r.op, call=r.call, io=r.io, slot=r.slot, arg=r.value, dtype=v.dtype, shape=v.shape,
            device=device, numel=v.numel, stats=v.stats, data=v.data, key=v.key,
            producer=None if r.producer is None else base + r.producer, param=r.param,
            node=r.node, args=r.args, source=r.source,
            note="; ".join(n for n in (r.note, v.note) if n) or None))
    return rows
