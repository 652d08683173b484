"""Module paths of ONNX nodes, so ONNX Runtime records line up with a PyTorch dump.

Both torch.onnx exporters leave the module a node came from, in different places:

- **dynamo exporter** (``torch.onnx.export(..., dynamo=True)``, the default since torch 2.9):
  node ``metadata_props`` hold ``pkg.torch.onnx.name_scopes``, a list such as
  ``['', 'layers.0', 'layers.0.mlp', 'layers.0.mlp.0', 'linear_2']``: the root, then the
  qualified name of each enclosing module, then the FX node name. The module path is the
  entry before last. ``namespace`` (``': __main__.Net/layers.0: ...Block/add: aten.add.Tensor'``)
  and ``pkg.torch.onnx.fx_node`` name the aten op; ``pkg.torch.onnx.stack_trace`` the source.
- **TorchScript exporter** (``dynamo=False``): node names are scope paths,
  ``/layers.0/mlp/mlp.0/MatMul_1``. Each component is a module's qualified name cut at
  its last non-numeric atom (``mlp.0`` inside ``mlp``; ``layers.0`` for item 0 of a
  ModuleList that is never called itself), and the last component is the op type with an
  optional ``_N`` counter. :func:`module_from_scope_name` undoes the cut.

ONNX Runtime's optimizer renames fused nodes after the first node it fused
(``/layers.0/norm1/Mul/LayerNormFusion/``, ``node_MatMul_1/MatMulAddFusion``) and drops
metadata; :func:`resolve_modules` maps such nodes back through the original graph by
name prefix. Nodes with no scope at all (an exporter's ``Identity`` for a shared weight,
a ``Reshape`` ORT inserted around a Gemm) take the deepest module common to their graph
neighbours and are marked as inferred.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

NAME_SCOPES = "pkg.torch.onnx.name_scopes"
FX_NODE = "pkg.torch.onnx.fx_node"
STACK_TRACE = "pkg.torch.onnx.stack_trace"
NAMESPACE = "namespace"

_OP_COMPONENT = re.compile(r"^[A-Z][A-Za-z0-9]*(_\d+)?$")
_FX_TARGET = re.compile(r"target=torch\.ops\.([\w.]+)")
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


@dataclass
class NodeScope:
    """Where a node comes from in the PyTorch model.

    ``module`` is a ``named_modules()`` path (``""`` for the root or when unknown);
    ``how`` says how it was found: ``metadata`` (dynamo exporter), ``name`` (TorchScript
    scope name), ``original`` (through the pre-optimisation graph), ``inferred`` (from
    graph neighbours) or ``none``.
    """

    module: str = ""
    how: str = "none"
    torch_op: str | None = None
    source: str | None = None


@dataclass
class ScopedNode:
    """The few facts about a node that scope resolution needs (tests build these by hand)."""

    name: str
    op_type: str
    inputs: Sequence[str] = ()
    outputs: Sequence[str] = ()
    metadata: dict[str, str] = field(default_factory=dict)


def module_from_metadata(metadata: dict[str, str]) -> str | None:
    """Module path from the dynamo exporter's ``name_scopes``; None when absent."""
    raw = metadata.get(NAME_SCOPES)
    if not raw:
        return None
    try:
        scopes = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return None
    if not isinstance(scopes, (list, tuple)) or not scopes:
        return None
    scopes = [str(s) for s in scopes]
    # [root, module..., fx node]: the entry before last is the innermost module.
    return scopes[-2] if len(scopes) >= 2 else ""


def torch_op_from_metadata(metadata: dict[str, str]) -> str | None:
    """The aten op the dynamo exporter lowered (``aten.linear.default``); None when absent."""
    m = _FX_TARGET.search(metadata.get(FX_NODE, ""))
    if m:
        return m.group(1)
    namespace = metadata.get(NAMESPACE, "")
    if ": " in namespace:
        last = namespace.rsplit("/", 1)[-1]
        op = last.rsplit(": ", 1)[-1].strip()
        return op or None
    return None


def source_from_metadata(metadata: dict[str, str]) -> str | None:
    """``file:line`` of the user's code that produced the node (first frame of the trace)."""
    frames = _FRAME.findall(metadata.get(STACK_TRACE, ""))
    return f"{frames[0][0]}:{frames[0][1]}" if frames else None


def module_from_scope_name(name: str, op_type: str | None = None,
                           known: set[str] | None = None) -> str | None:
    """Module path from a TorchScript exporter node name (``/layers.0/mlp/mlp.0/MatMul``).

    Args:
        name: the node name. Names without a leading ``/`` carry no scope (None).
        op_type: the node's op type; the component naming it ends the scope. When it is
            absent (a fused node), the first component that looks like an op type does.
        known: ``named_modules()`` paths of the model, to settle ambiguous joins.
    """
    if not name.startswith("/"):
        return None
    parts = [p for p in name.split("/") if p]
    scope = _scope_components(parts, op_type)
    if scope is None:
        return None
    path = ""
    for comp in scope:
        path = _join(path, comp, known)
    return path


def _scope_components(parts: list[str], op_type: str | None) -> list[str] | None:
    if not parts:
        return None
    last = parts[-1]
    if op_type and (last == op_type or re.fullmatch(re.escape(op_type) + r"_\d+", last)):
        return parts[:-1]
    for i, comp in enumerate(parts):
        if _OP_COMPONENT.match(comp):
            return parts[:i]
    return None


def _join(path: str, comp: str, known: set[str] | None) -> str:
    """Append a scope component, undoing the exporter's cut at the last non-numeric atom.

    A component ``mlp.0`` under ``layers.0.mlp`` is the child ``layers.0.mlp.0``: the path's
    tail from some atom on (``mlp``) is a proper prefix of the component's atoms.
    """
    plain = f"{path}.{comp}" if path else comp
    atoms, have = comp.split("."), path.split(".") if path else []
    candidates = [".".join(have[:k] + atoms) for k in range(len(have) - 1, -1, -1)
                  if len(have) - k < len(atoms) and atoms[:len(have) - k] == have[k:]]
    if not candidates:
        return plain
    if known is not None:
        for candidate in candidates + [plain]:
            if candidate in known:
                return candidate
    return candidates[0]


def scope_of(node: ScopedNode, known: set[str] | None = None) -> NodeScope:
    """Scope of one node from its own metadata or name (no graph context)."""
    torch_op = torch_op_from_metadata(node.metadata)
    source = source_from_metadata(node.metadata)
    module = module_from_metadata(node.metadata)
    if module is not None:
        return NodeScope(module, "metadata", torch_op, source)
    module = module_from_scope_name(node.name, node.op_type, known)
    if module is not None:
        return NodeScope(module, "name", torch_op, source)
    return NodeScope("", "none", torch_op, source)


def resolve_modules(nodes: Sequence[ScopedNode], original: Sequence[ScopedNode] | None = None,
                    known: Iterable[str] | None = None) -> list[NodeScope]:
    """Scopes of every node of a graph, in order.

    Args:
        nodes: the graph that runs (the original file, or ORT's optimised copy).
        original: the graph as exported, when ``nodes`` is an optimised copy: a fused node
            takes the scope of the original node its name starts with.
        known: ``named_modules()`` paths, when the PyTorch model is at hand.
    """
    known_set = set(known) if known is not None else None
    scopes = [scope_of(n, known_set) for n in nodes]
    if original is not None:
        by_name = {n.name: scope_of(n, known_set) for n in original}
        for i, node in enumerate(nodes):
            if node.name in by_name and scopes[i].how in ("none", "name"):
                scopes[i] = by_name[node.name]
            elif scopes[i].how == "none":
                hit = _longest_prefix(node.name, by_name)
                if hit is not None and by_name[hit].how != "none":
                    src = by_name[hit]
                    scopes[i] = NodeScope(src.module, "original", src.torch_op, src.source)
    _infer_from_neighbours(nodes, scopes)
    return scopes


def _longest_prefix(name: str, names: dict[str, NodeScope]) -> str | None:
    parts = name.split("/")
    for end in range(len(parts) - 1, 0, -1):
        prefix = "/".join(parts[:end])
        if prefix in names:
            return prefix
    return None


def _infer_from_neighbours(nodes: Sequence[ScopedNode], scopes: list[NodeScope]) -> None:
    producer = {out: i for i, n in enumerate(nodes) for out in n.outputs if out}
    consumers: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        for name in n.inputs:
            if name:
                consumers.setdefault(name, []).append(i)
    for i, node in enumerate(nodes):
        if scopes[i].how != "none":
            continue
        neighbours = [producer[x] for x in node.inputs if x in producer]
        neighbours += [j for out in node.outputs for j in consumers.get(out, [])]
        modules = [scopes[j].module for j in neighbours if scopes[j].how not in ("none", "inferred")]
        if modules:
            scopes[i] = NodeScope(_common_module(modules), "inferred",
                                  scopes[i].torch_op, scopes[i].source)


def _common_module(modules: list[str]) -> str:
    split = [m.split(".") if m else [] for m in modules]
    common: list[str] = []
    for atoms in zip(*split):
        if any(a != atoms[0] for a in atoms):
            break
        common.append(atoms[0])
    return ".".join(common)
