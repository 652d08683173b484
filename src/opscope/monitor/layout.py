"""What an optimizer step hands the monitor, found once and then reused while it holds.

Per optimizer: its parameters (the tensors, and the slots of their names in the model
hooks: :class:`Params`), with the series ids of its gradients per set of gradients present;
the ids of its state (``exp_avg``, ``exp_avg_sq``, ...) and of the weights, and how to find
their tensors again (:class:`_State`). Finding the state takes a lookup per parameter in
``optimizer.state``, whose keys are tensors (a hash is a Python call each): it is done once,
then each step takes the tensors from the state dicts found, in C loops, and sees that the
sum of their ids is as found (a state tensor replaced: found again). The cache holds a few
layouts and starts again when it outgrows that; :meth:`OptimizerLayouts.clear` drops them
(and the tensors they hold) at stop.
"""

from __future__ import annotations

import operator
from array import array
from collections.abc import Iterator
from itertools import chain, repeat
from typing import Any

import numpy as np
import torch

from opscope.monitor import stats, torchext
from opscope.monitor.hooks import ModelHooks
from opscope.monitor.registry import SeriesTable

STATE_KINDS = ("exp_avg", "exp_avg_sq", "momentum_buffer", "max_exp_avg_sq")
CACHED = 8  # layouts kept per cache (a cache that outgrows it starts again)
_GRAD, _PARAMS = operator.attrgetter("grad"), operator.itemgetter("params")


def ids_array(ids: list[int]) -> np.ndarray:
    """Series ids as the array the statistics travel with (a layout holds its own: int16 while
    they fit, else int32)."""
    return np.array(ids, dtype=np.int16 if max(ids, default=0) < 2**15 else np.int32)


def _put(cache: dict[Any, Any], key: Any, value: Any) -> Any:
    """``cache[key] = value``, the cache bounded (emptied when full: layouts rarely change)."""
    if len(cache) >= CACHED:
        cache.clear()
    cache[key] = value
    return value


class Params:
    """An optimizer's parameters: the tensors (its group's own list when it has one group) and
    the slots of their names in the hooks (-1: a tensor the hooks do not know, named by its
    group and index); their places in backward are the hooks' (see :meth:`place`)."""

    __slots__ = ("params", "slots", "grads", "_hooks", "_sizes")

    def __init__(self, params: list[torch.Tensor], hooks: ModelHooks, sizes: tuple[int, ...]) -> None:
        self.params, self.slots, self._hooks, self._sizes = params, array("i", hooks.slots(params)), hooks, sizes
        # which gradients are present (None: all) -> their ids, and which of them (None: all)
        self.grads: dict[tuple[bool, ...] | None, tuple[np.ndarray, list[int] | None]] = {}

    def name(self, i: int) -> str:
        """The name of parameter ``i``."""
        slot = self.slots[i]
        if slot >= 0:
            return self._hooks.names[slot]
        for group, size in enumerate(self._sizes):
            if i < size:
                return f"group{group}.param{i}"
            i -= size
        raise IndexError(i)

    def place(self, i: int) -> int:
        """Where backward made parameter ``i``'s gradient; not known: the parameters' order, reversed."""
        slot = self.slots[i]
        return (self._hooks.place_of(slot) if slot >= 0 else 0) or len(self.params) - 1 - i

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor, int]]:
        """``(name, tensor, place)`` of each parameter."""
        return ((self.name(i), p, self.place(i)) for i, p in enumerate(self.params))

    def __len__(self) -> int:
        return len(self.params)


class _State:
    """The optimizer's state and weights as :meth:`OptimizerLayouts.after` found them: the
    ids followed, and what makes their tensors again each step and sees that it still holds."""

    __slots__ = ("state", "params", "size", "dicts", "entries", "kinds", "sum", "ids", "chosen", "weights")

    def __init__(self, state: Any, params: Params, dicts: list[dict[str, Any]],
                 kinds: list[tuple[str, list[dict[str, Any]]]]) -> None:
        self.state, self.params, self.size = state, params, len(state)
        self.dicts, self.entries = dicts, sum(map(len, dicts))
        self.kinds = kinds  # per kind: the state dicts that hold it (``dicts`` itself when all do)
        self.sum = sum(map(id, self.found()))  # the state tensors' ids, summed: none is held here
        self.ids = np.zeros(0, dtype=np.int32)
        self.chosen: list[int] | None = None  # which state tensors are followed (None: all)
        self.weights: list[torch.Tensor] = []

    def found(self) -> list[torch.Tensor]:
        """The tensor each state dict holds now, kind after kind (C loops)."""
        get: Any = dict.get
        return list(chain.from_iterable(map(get, dicts, repeat(kind)) for kind, dicts in self.kinds))

    def tensors(self, state: Any, params: Params) -> list[torch.Tensor] | None:
        """The tensors of :attr:`ids` now; None when the state is not as found (another state
        dict or parameters, entries added or removed, a state tensor replaced)."""
        if self.state is not state or self.params is not params or len(state) != self.size:
            return None
        if sum(map(len, self.dicts)) != self.entries:
            return None
        found = self.found()
        if sum(map(id, found)) != self.sum:
            return None
        return (found if self.chosen is None else [found[i] for i in self.chosen]) + self.weights


class OptimizerLayouts:
    """The layouts of the optimizers one session follows (see the module docstring).

    Args:
        hooks: the session's model hooks (parameters' slots and places in backward).
        series: the session's series (ids found by a parameter's slot, else by name).
        state, weights: whether the optimizer's state and the weights are followed.
    """

    def __init__(self, hooks: ModelHooks, series: SeriesTable, state: bool, weights: bool) -> None:
        self.hooks, self.series, self.state, self.weights = hooks, series, state, weights
        self.reduced = 0  # under DDP: added to the gradients' places (after every rank's own, in the step)
        # id(optimizer) -> [the optimizer, its groups' sizes and the hooks' order, its Params, its _State]
        self._layouts: dict[int, list[Any]] = {}
        self._rates: dict[int, tuple[torch.optim.Optimizer, list[int]]] = {}  # its groups' lr ids
        self.extension: Any = None  # the torch extension (torchext), loaded at the first gradients
        self._loaded = False

    def clear(self) -> None:
        self._layouts = {}
        self._rates = {}

    def rates(self, optimizer: torch.optim.Optimizer, scalars: dict[int, float]) -> None:
        """Each parameter group's learning rate (``lr``, ``lr.group1``...) into ``scalars`` by
        series id, unless the step has the first one already (``m.step(lr=...)``)."""
        groups = optimizer.param_groups
        cached = self._rates.get(id(optimizer))
        if cached is None or cached[0] is not optimizer or len(cached[1]) != len(groups):
            ids = [self.series.scalar("lr", f"lr.group{g}" if g else "lr") for g in range(len(groups))]
            cached = _put(self._rates, id(optimizer), (optimizer, ids))
        ids = cached[1]
        if ids[0] not in scalars:
            for i, group in zip(ids, groups, strict=True):
                lr = group["lr"]
                scalars[i] = lr if type(lr) is float else stats.scalar_stats(lr)

    def grad_batch(self, params: Params) -> tuple[np.ndarray, stats.Pending | stats.Running] | None:
        """The ids of the gradients present and their statistics started on the kernel's native
        thread (:class:`~opscope.monitor.stats.Pending` with ``background=True``); None when
        there are none. When every gradient is present as last found, their arguments are read
        by the torch extension in one call (:func:`~opscope.monitor.stats.background_grads`)."""
        if not self._loaded:
            self._loaded = True
            self.extension = torchext.load() if stats.NATIVE and stats.BATCHED else None
        layout = params.grads.get(None)  # (every gradient present and non-empty: chosen None)
        if self.extension is not None and layout is not None and layout[1] is None:
            pending = stats.background_grads(params.params, self.extension)
            if pending is not None:
                return layout[0], pending
        ids, tensors = self.grads(params)
        return (ids, stats.Pending(tensors, background=True)) if len(ids) else None

    def params(self, optimizer: torch.optim.Optimizer) -> Params:
        """Every parameter of ``optimizer``; kept while its groups hold the same parameters and
        the order of backward is as known."""
        shape = (tuple(map(len, map(_PARAMS, optimizer.param_groups))), self.hooks.ordered)  # (C loops)
        cached = self._layouts.get(id(optimizer))
        if cached is not None and cached[0] is optimizer and cached[1] == shape:
            return cached[2]
        groups = optimizer.param_groups
        tensors = groups[0]["params"] if len(groups) == 1 else [p for group in groups for p in group["params"]]
        out = Params(tensors, self.hooks, shape[0])
        if len(self._layouts) >= CACHED:
            self._layouts.clear()
        self._layouts[id(optimizer)] = [optimizer, shape, out, None]
        return out

    def _id(self, kind: str, params: Params, i: int, shift: int = 0) -> int:
        """The series id of ``kind`` of parameter ``i`` (placed at its place + ``shift`` when new)."""
        slot, place = params.slots[i], params.place(i) + shift
        return self.series.slot_id(kind, slot, place) if slot >= 0 else self.series.id(kind, params.name(i), place)

    def grads(self, params: Params) -> tuple[np.ndarray, list[torch.Tensor]]:
        """The ids and tensors of the gradients present; ids found once per set of them."""
        grads: list[Any] = list(map(_GRAD, params.params))  # (C loops: see stats._DATA_PTR)
        every = not any(map(operator.is_, grads, repeat(None)))
        found = grads if every else [g for g in grads if g is not None]
        present = None if every else tuple(g is not None for g in grads)
        layout = params.grads.get(present)
        if layout is None:
            which = [i for i, g in enumerate(grads) if g is not None and g.numel()]
            ids = ids_array([self._id("grad", params, i, self.reduced) for i in which])
            layout = _put(params.grads, present, (ids, which if len(which) < len(grads) else None))
        ids, chosen = layout
        return ids, found if chosen is None else [grads[i] for i in chosen]

    def after(self, optimizer: torch.optim.Optimizer, params: Params) -> tuple[np.ndarray, list[torch.Tensor]]:
        """The ids and tensors of the optimizer's state and of the weights, after its step."""
        cached = self._layouts.get(id(optimizer))
        if cached is not None and cached[3] is not None:
            tensors = cached[3].tensors(optimizer.state, params)
            if tensors is not None:
                return cached[3].ids, tensors
        found = self._state(optimizer, params)
        if cached is not None and cached[2] is params:
            cached[3] = found
        return found.ids, found.tensors(optimizer.state, params)  # type: ignore[return-value]

    def _state(self, optimizer: torch.optim.Optimizer, params: Params) -> _State:
        """The state's tensors followed (one lookup per parameter) and the weights."""
        states = [optimizer.state.get(p) for p in params.params] if self.state else []
        dicts = [st for st in states if st]
        kinds: list[tuple[str, list[dict[str, Any]]]] = []
        chosen: list[int] = []  # of every state tensor (kind after kind), those followed
        ids: list[int] = []
        found = 0
        for kind in STATE_KINDS if states else ():
            holding: list[dict[str, Any]] = []
            for i, st in enumerate(states):
                t = st.get(kind) if st else None
                if isinstance(t, torch.Tensor):
                    if t.dim() and t.numel():
                        chosen.append(found)
                        ids.append(self._id(kind, params, i))
                    holding.append(st)  # type: ignore[arg-type]
                    found += 1
            if holding:  # one list for the kinds every state holds (Adam's two)
                kinds.append((kind, dicts if len(holding) == len(dicts) else holding))
        out = _State(optimizer.state, params, dicts, kinds)
        out.chosen = None if len(chosen) == found else chosen
        if self.weights:
            which = [i for i, p in enumerate(params.params) if p.numel()]
            ids += [self._id("weight", params, i) for i in which]
            out.weights = [params.params[i] for i in which]
        out.ids = ids_array(ids)
        return out
