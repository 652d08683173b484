"""What an optimizer step hands the monitor, found once and then reused while it holds.

Per optimizer: its parameters (name, tensor, place in backward) as three parallel lists
(:class:`Params`); the series ids of its gradients, per set of gradients present; the ids
and tensors of its state (``exp_avg``, ``exp_avg_sq``, ...) and of the weights. Finding the
state takes a lookup per parameter in ``optimizer.state``, whose keys are tensors (a hash is
a Python call each): it is done once, then each step only checks, in C loops, that the state
is what was found (:meth:`OptimizerLayouts.after`). The caches hold a few layouts each and
start again when they outgrow that; :meth:`OptimizerLayouts.clear` drops them (and the tensors
they hold) at stop.
"""

from __future__ import annotations

import operator
from array import array
from collections.abc import Callable, Iterator
from itertools import repeat
from typing import Any

import numpy as np
import torch

from opscope.monitor.hooks import ModelHooks

STATE_KINDS = ("exp_avg", "exp_avg_sq", "momentum_buffer", "max_exp_avg_sq")
CACHED = 8  # layouts kept per cache (a cache that outgrows it starts again)
_GRAD = operator.attrgetter("grad")


def ids_array(ids: list[int]) -> np.ndarray:
    """Series ids as the int64 array the statistics travel with."""
    return np.array(ids, dtype=np.int64)


def _put(cache: dict[Any, Any], key: Any, value: Any) -> Any:
    """``cache[key] = value``, the cache bounded (emptied when full: layouts rarely change)."""
    if len(cache) >= CACHED:
        cache.clear()
    cache[key] = value
    return value


class Params:
    """An optimizer's parameters: names, tensors and places in backward, in parallel lists."""

    __slots__ = ("names", "params", "places")

    def __init__(self) -> None:
        self.names: list[str] = []
        self.params: list[torch.Tensor] = []
        self.places = array("i")

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor, int]]:
        return zip(self.names, self.params, self.places, strict=True)

    def __len__(self) -> int:
        return len(self.params)


class _StateCheck:
    """What :meth:`OptimizerLayouts.after` found, to see cheaply that it still holds."""

    __slots__ = ("state", "params", "size", "dicts", "entries", "found")

    def __init__(self, state: Any, params: Params, dicts: list[dict[str, Any]],
                 found: list[tuple[str, list[dict[str, Any]], list[torch.Tensor]]]) -> None:
        self.state, self.params, self.size = state, params, len(state)
        self.dicts, self.entries = dicts, sum(map(len, dicts))
        self.found = found  # per kind: the state dicts that hold it and the tensor each holds

    def holds(self, state: Any, params: Params) -> bool:
        """The same state dict and parameters, as many entries, each state tensor the same object."""
        if self.state is not state or self.params is not params or len(state) != self.size:
            return False
        if sum(map(len, self.dicts)) != self.entries:
            return False
        return all(all(map(operator.is_, map(dict.get, dicts, repeat(kind)), tensors))
                   for kind, dicts, tensors in self.found)


class OptimizerLayouts:
    """The layouts of the optimizers one session follows (see the module docstring).

    Args:
        hooks: the session's model hooks (parameters' names and places in backward).
        place: ``(kind, name, position) -> series id``.
        state, weights: whether the optimizer's state and the weights are followed.
    """

    def __init__(self, hooks: ModelHooks, place: Callable[[str, str, int], int], state: bool, weights: bool) -> None:
        self.hooks, self.place, self.state, self.weights = hooks, place, state, weights
        self.reduced = 0  # under DDP: added to the gradients' places (after every rank's own, in the step)
        self._params: dict[int, tuple[torch.optim.Optimizer, Any, Params]] = {}
        # (params, which gradients are present: None for all) -> their ids, and which (None: all)
        self._grads: dict[tuple[int, tuple[bool, ...] | None], tuple[np.ndarray, list[int] | None]] = {}
        self._after: dict[int, tuple[_StateCheck, np.ndarray, list[torch.Tensor]]] = {}

    def clear(self) -> None:
        self._params, self._grads, self._after = {}, {}, {}

    def params(self, optimizer: torch.optim.Optimizer) -> Params:
        """Every parameter of ``optimizer``; kept while its groups hold the same parameters and
        the order of backward is as known."""
        shape = (tuple(len(g["params"]) for g in optimizer.param_groups), self.hooks.ordered)
        cached = self._params.get(id(optimizer))
        if cached is not None and cached[0] is optimizer and cached[1] == shape:
            return cached[2]
        out, n = Params(), sum(shape[0])
        for gi, group in enumerate(optimizer.param_groups):
            for pi, p in enumerate(group["params"]):
                out.names.append(self.hooks.name_of(p, f"group{gi}.param{pi}"))
                out.params.append(p)
                out.places.append(self.hooks.place(p) or n - 1 - len(out.places))
        _put(self._params, id(optimizer), (optimizer, shape, out))
        return out

    def grads(self, params: Params) -> tuple[np.ndarray, list[torch.Tensor]]:
        """The ids and tensors of the gradients present; ids found once per set of them."""
        grads: list[Any] = list(map(_GRAD, params.params))  # (C loops: see stats._DATA_PTR)
        every = not any(map(operator.is_, grads, repeat(None)))
        found = grads if every else [g for g in grads if g is not None]
        present = (id(params), None if every else tuple(g is not None for g in grads))
        layout = self._grads.get(present)
        if layout is None:
            which = [i for i, g in enumerate(grads) if g is not None and g.numel()]
            ids = ids_array([self.place("grad", params.names[i], params.places[i] + self.reduced) for i in which])
            layout = _put(self._grads, present, (ids, which if len(which) < len(grads) else None))
        ids, chosen = layout
        return ids, found if chosen is None else [grads[i] for i in chosen]

    def after(self, optimizer: torch.optim.Optimizer, params: Params) -> tuple[np.ndarray, list[torch.Tensor]]:
        """The ids and tensors of the optimizer's state and of the weights, after its step."""
        state = optimizer.state
        cached = self._after.get(id(optimizer))
        if cached is not None and cached[0].holds(state, params):
            return cached[1], cached[2]
        states = [state.get(p) for p in params.params] if self.state else []  # one lookup each
        found: list[tuple[str, list[dict[str, Any]], list[torch.Tensor]]] = []
        placed: list[tuple[int, torch.Tensor]] = []  # the ids followed and their tensors
        for kind in STATE_KINDS if states else ():
            dicts: list[dict[str, Any]] = []
            tensors: list[torch.Tensor] = []
            for (n, _, pos), st in zip(params, states, strict=True):
                t = st.get(kind) if st else None
                if isinstance(t, torch.Tensor):
                    dicts.append(st)  # type: ignore[arg-type]
                    tensors.append(t)
                    if t.dim() and t.numel():
                        placed.append((self.place(kind, n, pos), t))
            if tensors:
                found.append((kind, dicts, tensors))
        if self.weights:
            placed += [(self.place("weight", n, pos), p) for n, p, pos in params if p.numel()]
        check = _StateCheck(state, params, [st for st in states if st], found)
        ids, tensors = ids_array([i for i, _ in placed]), [t for _, t in placed]
        _put(self._after, id(optimizer), (check, ids, tensors))
        return ids, tensors
