"""Where a MindSpore op ran: its phase and module path, from its scope and the data flow.

The scope of a kernel's full name says it (``Default/network-WithLossCell/_backbone-Net/
b0-Block/fc1-Dense/MatMul-op0``: forward, module ``b0.fc1``), with two exceptions that the
IR's data flow (:class:`~.mindspore_ir.KernelGraph`) corrects:

- ops MindSpore expands from a functional call (``Expand/_Muls/Mul-op0``) name no cell: they
  go where the values they transform were made (else where they go), backward when what they
  read was;
- MindSpore reuses one compiled cell for identical cells, so an op of ``blocks.5`` can carry
  the scope of ``blocks.0`` (a GELU, a residual add, even a LayerNorm with its own weights).
  An op that reads weights goes to the module that owns them (``blocks.5.norm.gamma`` ->
  ``blocks.5.norm``); another, to the instance of its kind (``blocks.5`` for ``blocks.0``,
  ``b1`` for ``b0``) that both the last op before it and the next op after it that read
  weights are in (by execution order, not by data flow: a float16 net's casts would make the
  two dumps of one net decide differently). An op at the border of two instances keeps its
  scope.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter

from opscope.storage.peers.mindspore_ir import KernelGraph

OP_PREFIX = "mindspore."
EXPANDED = "Expand/"  # ops MindSpore expanded from a functional call: a scope of their own
# Cells that wrap the user's net for training; their scopes are dropped from module paths.
WRAPPERS = frozenset({"WithLossCell", "WithEvalCell", "WithGradCell", "TrainOneStepCell",
                      "TrainOneStepWithLossScaleCell", "ForwardValueAndGrad", "GradAccumulationCell",
                      "PipelineCell", "MicroBatchInterleaved", "_VirtualDatasetCell"})


def phase_of(full_name: str) -> str:
    """``Gradients/...`` -> backward; a scope inside ``optimizer-...`` -> optimizer; else forward."""
    segments = full_name.split("/")
    if segments[0] == "Gradients":
        return "backward"
    if any(s.split("-", 1)[0] == "optimizer" for s in segments[:-1]):
        return "optimizer"
    return "forward"


def module_of(full_name: str) -> str:
    """The cells of a scope as a module path: ``Default/network-WithLossCell/_backbone-Net/b0-Block/
    fc1-Dense/MatMul-op0`` -> ``b0.fc1`` (training wrappers and the net itself dropped)."""
    cells = [s.split("-", 1) for s in full_name.split("/")[:-1] if "-" in s]
    while cells and cells[0][1] in WRAPPERS:
        cells.pop(0)
    if cells and cells[0][0] == "_backbone":
        cells.pop(0)
    return ".".join(name for name, _ in cells)


def forward_op_of(full_name: str) -> str | None:
    """The forward op a gradient op differentiates (``.../Grad_MatMul/MatMul-op2`` -> MatMul)."""
    for segment in reversed(full_name.split("/")[:-1]):
        if segment.startswith("Grad_"):
            return OP_PREFIX + segment[len("Grad_"):]
    return None


def places(order: tuple[str, ...], graph: KernelGraph | None) -> dict[str, tuple[str, str]]:
    """(phase, module) of every op of ``order`` whose scope alone would misplace it."""
    found: dict[str, tuple[str, str]] = {}
    if graph is None:
        return found

    def place(full: str) -> tuple[str, str] | None:
        if full in found:
            return found[full]
        return None if full.startswith(EXPANDED) else (phase_of(full), module_of(full))

    # forward only: gradient ops are scoped by MindSpore's autodiff, often to an unrelated cell,
    # and moving them by the same rules made a float16 dump and its float32 reference place
    # some differently (cast ops in between): both sides keep MindSpore's scopes there
    _place_instances(order, graph, "forward", found)
    for full in order:  # ops MindSpore expanded: by the data flow
        if full.startswith(EXPANDED):
            producers = [p for s in graph.inputs.get(full, []) if s.kind == "kernel" and (p := place(s.name))]
            consumers = [c for name in graph.consumers.get(full, []) if (c := place(name))]
            found[full] = _expanded(producers, consumers)
    return found


def _place_instances(order: tuple[str, ...], graph: KernelGraph, phase: str,
                     found: dict[str, tuple[str, str]]) -> None:
    """Ops of ``phase`` whose scope names another instance of a reused cell, moved (see above)."""
    anchors: list[tuple[int, str]] = []  # ops that read weights: (position, module)
    for k, full in enumerate(order):
        if full.startswith(EXPANDED) or phase_of(full) != phase:
            continue
        owners = _owners(graph, full)
        if not owners:
            continue
        module = module_of(full)
        owner = next(iter(owners)) if len(owners) == 1 else None
        # only to another instance of its own kind: a weight's name is not always its owner's
        # path (a cell made on its own and assigned later names its weights from its own root)
        moved = _reused_instance(module, [owner]) if owner else module
        if moved != module:
            found[full] = (phase, moved)
        anchors.append((k, moved))
    positions = [k for k, _ in anchors]
    for k, full in enumerate(order):  # an op between two of them, by where it ran
        if full.startswith(EXPANDED) or phase_of(full) != phase or full in found:
            continue
        at = bisect.bisect_left(positions, k)
        if 0 < at < len(anchors) and positions[at] != k:
            moved = _reused_instance(module_of(full), [anchors[at - 1][1], anchors[at][1]])
            if moved != module_of(full):
                found[full] = (phase, moved)


def _owners(graph: KernelGraph, full: str) -> set[str]:
    """Modules owning the weights ``full`` reads."""
    return {s.name.rsplit(".", 1)[0] for s in graph.inputs.get(full, []) if s.kind == "param" and "." in s.name}


def _expanded(producers: list[tuple[str, str]], consumers: list[tuple[str, str]]) -> tuple[str, str]:
    phase = "backward" if any(p[0] == "backward" for p in producers) else (
        producers[0][0] if producers else "forward")
    made = _common_prefix([m for p, m in producers if m and p == phase])
    return phase, made or _common_prefix([m for p, m in consumers if m and p == phase])


def _kind(name: str) -> str:
    return re.sub(r"\d+", "", name)


def _reused_instance(module: str, neighbours: list[str]) -> str:
    """``module`` moved to the instance of its kind that more of its neighbours name than
    agree with its own (``blocks.0.act`` between ``blocks.5.fc1`` and ``blocks.5.fc2`` ->
    ``blocks.5.act``); unchanged on a tie."""
    if not module:
        return module
    mine = module.split(".")
    votes: Counter[tuple[int, str]] = Counter()
    agree = 0
    for neighbour in neighbours:
        theirs = neighbour.split(".")
        i = next((k for k in range(min(len(mine), len(theirs))) if mine[k] != theirs[k]), None)
        if i is None or _kind(mine[i]) != _kind(theirs[i]):
            agree += 1  # in its instance (a sibling of another kind differs only below it)
        else:
            votes[(i, theirs[i])] += 1
    ranked = votes.most_common(2)
    if not ranked or ranked[0][1] <= agree or (len(ranked) > 1 and ranked[0][1] == ranked[1][1]):
        return module
    (i, instance), _ = ranked[0]
    return ".".join([*mine[:i], instance, *mine[i + 1:]])


def _common_prefix(modules: list[str]) -> str:
    if not modules:
        return ""
    parts = modules[0].split(".")
    for module in modules[1:]:
        other = module.split(".")
        n = 0
        while n < min(len(parts), len(other)) and parts[n] == other[n]:
            n += 1
        parts = parts[:n]
    return ".".join(parts)
