"""The op-table interface (see :mod:`opscope.compare.crossframework.tables`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from opscope.compare.crossframework import torchnames

__all__ = ["OpTable"]


@dataclass(frozen=True)
class OpTable:
    """What alignment needs to know about one framework's ops, as data.

    Every mapping is keyed by :attr:`key` of an op (the ``op`` column of a record reduced to
    the spelling the table uses) and lists torch ops by :func:`~.torchnames.torch_keys`.
    """

    framework: str                               # the capture level of its dumps ("onnx")
    to_torch: Mapping[str, frozenset[str]]       # op -> torch ops it may compute
    decompositions: Mapping[str, frozenset[str]]  # torch op -> ops an exported decomposition may hold
    fusions: Mapping[str, frozenset[str]]        # fused op -> torch ops of the group it covers
    folded: Mapping[str, frozenset[str]]         # torch op -> op types it is folded into (no node of its own)
    internal: frozenset[str]                     # bookkeeping ops with no torch counterpart
    order_preserving: frozenset[str]             # ops that keep every element in place
    movement: frozenset[str]                     # op types that only move or copy elements
    key: Callable[[str], str]                    # ``op`` column -> table key
    op_type: Callable[[str], str]                # ``op`` column -> its type, domain aside
    activation_attrs: tuple[str, ...] = ()       # attributes naming an activation fused into the op
    name: str = ""                               # in messages: "ONNX" (default: the level)
    runtime: str = ""                            # in messages: "ONNX Runtime" (default: "the runtime")
    layers: bool = False                         # its ops are layers (module level): match them by layer
    fold_targets: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fold_targets", frozenset().union(*self.folded.values()))
        object.__setattr__(self, "name", self.name or self.framework)
        object.__setattr__(self, "runtime", self.runtime or "the runtime")

    def torch_ops_for(self, op: str) -> frozenset[str]:
        """Every torch op this framework's ``op`` may stand for (directly, fused, or folding one in)."""
        key = self.key(op)
        out = set(self.to_torch.get(key, ())) | self.fusions.get(key, frozenset())
        out |= {t for t, targets in self.folded.items() if key in targets}
        return frozenset(out)

    def corresponds(self, op: str, torch_op: str) -> bool:
        """True when ``op`` may compute what ``torch_op`` computes (their outputs may be paired)."""
        return not torchnames.torch_keys(torch_op).isdisjoint(self.torch_ops_for(op))

    def computes_itself(self, op: str, torch_op: str) -> bool:
        """True when ``op`` is the torch op's own node (a BatchNormalization for a batch norm)."""
        own = self.to_torch.get(self.op_type(op), frozenset())
        return not torchnames.torch_keys(torch_op).isdisjoint(own)

    def is_internal(self, op: str) -> bool:
        """True for bookkeeping ops that have no torch counterpart (:attr:`internal`)."""
        return self.key(op) in self.internal

    def decomposition_parts(self, torch_op: str) -> frozenset[str]:
        """The op keys an exported decomposition of ``torch_op`` may hold (empty: none)."""
        return frozenset().union(*(self.decompositions.get(k, frozenset()) for k in torchnames.torch_keys(torch_op)))

    def is_decomposition(self, torch_op: str, ops: Iterable[str]) -> bool:
        """True when ``ops`` (in order) can be an exported decomposition of ``torch_op``:
        internal ops aside, at least two remain, all in its :attr:`decompositions` set."""
        allowed = self.decomposition_parts(torch_op)
        keys = [self.key(o) for o in ops if not self.is_internal(o)]
        return bool(allowed) and len(keys) >= 2 and all(k in allowed for k in keys)

    def fused_group(self, op: str) -> frozenset[str]:
        """The torch ops one fused ``op`` may cover (empty: it fuses nothing)."""
        return self.fusions.get(self.key(op), frozenset())

    def is_fusion(self, op: str, torch_ops: Iterable[str]) -> bool:
        """True when one fused ``op`` can stand for ``torch_ops`` (in order): element-preserving
        torch ops aside, at least two remain, all covered, and the last is one of them (the
        fused op's output is the last op's output)."""
        covered = self.fused_group(op)
        ops = list(torch_ops)
        if not covered or not ops or torchnames.preserves_order(ops[-1]):
            return False
        core = [o for o in ops if not torchnames.preserves_order(o)]
        return len(core) >= 2 and all(not torchnames.torch_keys(o).isdisjoint(covered) for o in core)

    def folds_into(self, torch_op: str) -> frozenset[str]:
        """The op types ``torch_op`` is folded into by exporters (empty: never folded)."""
        return frozenset().union(*(self.folded.get(k, frozenset()) for k in torchnames.torch_keys(torch_op)))

    def preserves_order(self, op: str) -> bool:
        return self.key(op) in self.order_preserving

    def moves_data(self, op: str) -> bool:
        """Ops that only move or copy elements: position alone does not prove a pairing."""
        return self.op_type(op) in self.movement
