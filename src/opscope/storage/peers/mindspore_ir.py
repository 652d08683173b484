"""Data flow of a MindSpore kernel graph, read from the text IR its Data Dump writes.

``rank_N/graphs/ms_output_trace_code_graph_<G>.ir`` lists the graph's nodes in SSA form::

    %1(equiv_21_x) = PrimFunc_MatMul(%para7_inputs0, %0, Bool(0), Bool(1)) {...} ...
        ...
        # Fullname with scope: (Default/network-WithLossCell/_backbone-Net/fc1-Dense/MatMul-op0)

Each argument is another node (``%0``), a graph parameter (``%para7_inputs0``: a model input,
or a weight when its declaration says ``is_parameter``), a constant (``Bool(0)``,
``F32(1e-07)``, ``Tensor(shape=[1], ...)``) or a monad that only orders side effects
(``UMonad[U]``, an ``UpdateState`` node). The dump writes one ``input.<slot>`` file per
argument that is not a monad, in order. Kernels are the nodes named in the execution-order
CSV; ``Load``, ``Depend`` and ``TupleGetItem`` are bookkeeping that this module sees through,
so each kernel input resolves to the kernel output (and slot) or the weight it reads.

Only the text is parsed; nothing from the file is executed or turned into a path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

_NODE = re.compile(r"^\s*%(\d+)\([^)]*\)\s*=\s*([A-Za-z_][\w]*)\((.*)$")
_SCOPE = re.compile(r"^\s*#\s*Fullname with scope:\s*\((.*)\)\s*$")
_PARAM = re.compile(r"^%(para\d+)_(\S+?):\s*<(.*)$")
_IN_FILE = re.compile(r"^\s*#\s*In file (.+?):(\d+)")
_LIBRARY = ("site-packages", "dist-packages", "/mindspore/")  # frames that are not the user's
_MONADS = ("UMonad", "IOMonad")
_SIDE_EFFECT_ONLY = ("UpdateState",)  # nodes that only order side effects: monads
_SEE_THROUGH = ("Load", "Depend")  # value of the first argument
_MAX_HOPS = 32


@dataclass(frozen=True)
class Source:
    """Where a kernel input comes from: ``kind`` is ``kernel`` (``name``'s output ``slot``),
    ``param`` (a weight called ``name``), ``input`` (a model input) or ``const`` (``name`` is the
    constant as the IR writes it)."""

    kind: str
    name: str
    slot: int = 0


@dataclass
class _Node:
    op: str
    args: list[str]
    scope: str = ""
    types: list[str] = field(default_factory=list)  # the ": (...) -> (...)" lines under the node
    source: str = ""  # the innermost line of the user's code that made it ("# In file ...")


@dataclass
class KernelGraph:
    """For each kernel (by its full scoped name): the op type and where each input comes from."""

    ops: dict[str, str] = field(default_factory=dict)
    inputs: dict[str, list[Source]] = field(default_factory=dict)
    # the dtypes the kernel's device buffers hold: (inputs, outputs), None where not a tensor
    device_dtypes: dict[str, tuple[list[str | None], list[str | None]]] = field(default_factory=dict)
    consumers: dict[str, list[str]] = field(default_factory=dict)  # kernel -> kernels reading it
    sources: dict[str, str] = field(default_factory=dict)  # kernel -> "file:line" of the user's code
    # the shapes the graph infers: (inputs, outputs), None where unknown or not a tensor
    shapes: dict[str, tuple[list[list[int] | None], list[list[int] | None]]] = field(default_factory=dict)


def read_graph(path: Path) -> KernelGraph:
    """Parse one ``ms_output_trace_code_graph_<G>.ir``; an unreadable file raises OSError."""
    nodes: dict[str, _Node] = {}
    weights: set[str] = set()
    last: _Node | None = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = _NODE.match(line)
            if m:
                last = nodes[m.group(1)] = _Node(_op_type(m.group(2)), split_args(m.group(3)))
                continue
            if last is not None and not last.scope and line.lstrip().startswith(": ("):
                last.types.append(line.strip()[1:].strip())
                continue
            s = _SCOPE.match(line)
            if s and last is not None and not last.scope:
                last.scope = s.group(1)
                continue
            f_ = _IN_FILE.match(line)
            if f_ and last is not None and not any(lib in f_.group(1) for lib in _LIBRARY):
                last.source = f"{f_.group(1)}:{f_.group(2)}"
                continue
            p = _PARAM.match(line)
            if p and "is_parameter" in p.group(3):
                weights.add(p.group(1))
    return _kernels(nodes, weights)


def _op_type(name: str) -> str:
    return name.removeprefix("PrimFunc_")


def split_args(text: str, opening: str = "([{", closing: str = ")]}") -> list[str]:
    """The top-level, comma-separated arguments of a call whose text starts after its '('."""
    args, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in opening:
            depth += 1
        elif ch in closing:
            if depth == 0:
                tail = text[start:i].strip()
                if tail:
                    args.append(tail)
                return args
            depth -= 1
        elif ch == "," and depth == 0:
            args.append(text[start:i].strip())
            start = i + 1
    return args


def _kernels(nodes: dict[str, _Node], weights: set[str]) -> KernelGraph:
    graph = KernelGraph()
    for node in nodes.values():
        if not node.scope or node.op in (*_SEE_THROUGH, *_SIDE_EFFECT_ONLY, "TupleGetItem", "MakeTuple", "Return"):
            continue
        sources = []
        for arg in node.args:
            if _is_monad(arg, nodes):
                continue
            sources.append(_resolve(arg, nodes, weights))
        graph.ops[node.scope] = node.op
        graph.inputs[node.scope] = sources
        if node.source:
            graph.sources[node.scope] = node.source
        for source in sources:
            if source.kind == "kernel":
                graph.consumers.setdefault(source.name, []).append(node.scope)
        if len(node.types) >= 2:
            graph.device_dtypes[node.scope] = _device_dtypes(node.types[1])
        if node.types:
            graph.shapes[node.scope] = _shapes(node.types[0])
    return graph


_TENSOR_SHAPE = re.compile(r"Tensor\[\w+\]\]?,\s*\(([-\d,\s]*)\)")


def _shapes(line: str) -> tuple[list[list[int] | None], list[list[int] | None]]:
    """``(<Tensor[Float32], (4, 16)>, <UMonad, NoShape>) -> (<Tensor[Float16], (4, 16)>)`` ->
    the inferred shapes of the tensor arguments (monads dropped) and of the outputs."""
    left, _, right = line.partition("->")

    def shapes(part: str) -> list[list[int] | None]:
        part = part.strip()
        items = split_args(part[1:], "([{<", ")]}>") if part.startswith("(") else [part]
        out: list[list[int] | None] = []
        for item in items:
            if "Monad" in item:
                continue
            m = _TENSOR_SHAPE.search(item) if item.startswith(("<Tensor", "<Ref")) else None
            out.append([int(x) for x in m.group(1).replace(" ", "").split(",") if x] if m else None)
        return out
    return shapes(left), shapes(right)


def _device_dtypes(line: str) -> tuple[list[str | None], list[str | None]]:
    """``(<Float32xDefaultFormat[...]{4, 8}>, <UMonad, NoShape>) -> (<Float16x...>)`` -> the
    dtypes of the tensor arguments (monads dropped) and of the outputs, lower case."""
    left, _, right = line.partition("->")
    def dtypes(part: str) -> list[str | None]:
        part = part.strip()
        items = split_args(part[1:], "([{<", ")]}>") if part.startswith("(") else [part]
        out: list[str | None] = []
        for item in items:
            if "Monad" in item:
                continue
            m = re.match(r"<(\w+?)x\w*\[", item)
            out.append(m.group(1).lower() if m else None)
        return out
    return dtypes(left), dtypes(right)


def _is_monad(arg: str, nodes: dict[str, _Node]) -> bool:
    if arg.startswith(_MONADS):
        return True
    ref = _ref(arg)
    return ref is not None and ref in nodes and nodes[ref].op in _SIDE_EFFECT_ONLY


def _ref(arg: str) -> str | None:
    return arg[1:] if arg.startswith("%") and arg[1:].isdigit() else None


def _resolve(arg: str, nodes: dict[str, _Node], weights: set[str]) -> Source:
    slot = 0
    for _ in range(_MAX_HOPS):
        if arg.startswith("%para"):
            key, _, name = arg[1:].partition("_")
            return Source("param" if key in weights else "input", name)
        ref = _ref(arg)
        node = nodes.get(ref) if ref is not None else None
        if node is None:
            return Source("const", arg)
        if node.op == "TupleGetItem" and len(node.args) == 2:
            slot = _index(node.args[1])
            arg = node.args[0]
        elif node.op in _SEE_THROUGH and node.args:
            arg = node.args[0]
        elif node.scope:
            return Source("kernel", node.scope, slot)
        else:
            break
    return Source("const", arg)


def _index(text: str) -> int:
    m = re.search(r"\((-?\d+)\)", text) or re.fullmatch(r"\s*(-?\d+)\s*", text)
    return int(m.group(1)) if m else 0
