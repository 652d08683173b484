"""Phase timers of the training trace: the hooks and patches, and the intervals they see.

Per event the work is one clock mark and one list append. Every hook and patch is undone
by :meth:`PhaseTimers.remove`, which the session calls on every exit path.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

from opscope.profile.model import PRIORITY

Hook = Callable[[], None]


def _fresh() -> dict[str, list[Any]]:
    return {p: [] for p in PRIORITY}


class PhaseTimers:
    """Installs the training-trace hooks and collects one step's phase intervals.

    Args:
        clock: a :mod:`~opscope.profile.clock` clock.
        on_outer_call: called with the outermost module about to run (step detection).
        on_optimizer_step: called after each ``optimizer.step()`` (step detection).
        poll: called at data-loader and backward entry (resolves a pending boundary).
        on_zero_grad: called at zero_grad entry (step detection); None: ``poll``.
        fp_point / bp_point: module paths, or None for the automatic points.
        detailed: False records step boundaries only (``training_trace=False``).
    """

    def __init__(
        self,
        clock: Any,
        on_outer_call: Callable[[Any], None],
        on_optimizer_step: Hook,
        poll: Hook,
        fp_point: str | None = None,
        bp_point: str | None = None,
        detailed: bool = True,
        on_zero_grad: Hook | None = None,
    ) -> None:
        self.clock = clock
        self.mark = clock.mark
        self.detailed = detailed
        self.fp_point, self.bp_point = fp_point, bp_point
        self.intervals = _fresh()
        self.notes: list[str] = []
        self.active = False
        self._on_outer, self._on_opt, self._poll = on_outer_call, on_optimizer_step, poll
        self._on_zero_grad = on_zero_grad or poll
        self._depth = 0
        self._in_backward = 0
        self._opt_depth = 0
        self._opt_open: Any = None
        self._opt_paused = False  # a closure inside optimizer.step() runs forward/backward
        self._fwd_open: Any = None
        self._last_outer_end: Any = None
        self._acc_host = -1
        self._acc_token: Any = None
        self._acc_handles: dict[int, Any] = {}  # id(parameter) -> its post-accumulate hook
        self._acc_last = -1  # id of the parameter whose gradient was accumulated last
        self._acc_lasts: set[int] | None = set()  # ... at the end of each backward, until narrow()
        self._seen: set[int] = set()
        self._hooked: set[int] = set()
        self._found: dict[str, bool] = {k: False for k in (fp_point, bp_point) if k}
        self._handles: list[Any] = []
        self._global: list[Any] = []  # the global module hooks, until narrow() swaps them
        self._roots: list[weakref.ref[Any]] = []
        self._narrow_due = False
        self._patches: list[tuple[Any, str, Any, Any]] = []

    # ------------------------------------------------------------------ install / remove
    def install(self) -> None:
        """Register the global hooks and patches. Call :meth:`remove` on every exit path."""
        import torch
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_module

        self.active = True
        self._global = [nn_module.register_module_forward_pre_hook(self._module_pre),
                        nn_module.register_module_forward_hook(self._module_post, always_call=True)]
        self._handles.extend(self._global)
        self._handles.append(optim_module.register_optimizer_step_pre_hook(self._opt_pre))
        self._handles.append(optim_module.register_optimizer_step_post_hook(self._opt_post))
        if not self.detailed:
            return
        from torch.utils.data import dataloader

        self._patch(torch.autograd, "backward", self._wrap_backward)
        self._patch(dataloader._BaseDataLoaderIter, "__next__", lambda f: self._wrap_timed(f, "data_wait", self._poll))
        zero_grad = self._on_zero_grad
        self._patch(torch.optim.Optimizer, "zero_grad", lambda f: self._wrap_timed(f, "zero_grad", zero_grad))
        self._patch(torch.nn.Module, "zero_grad", lambda f: self._wrap_timed(f, "zero_grad", zero_grad))
        from opscope.profile import comm

        self._patches.extend(comm.patch_collectives(self))

    def narrow(self) -> None:
        """Swap the global module hooks for hooks on the outermost modules seen so far.

        A global module hook sends every module call of the model through torch's slow
        call path (~1-2 us a call: 0.2 ms a step on a model of 150 modules); hooks on the
        outermost modules alone cost that once per forward. Done after a step or two, when
        the training loop's outermost modules have all been called; one first called after
        that is not seen (see docs/profile.md). Waits for the outermost call to return.
        """
        if not self._global or not self.active:
            return
        if self._depth:
            self._narrow_due = True
            return
        self._narrow_due = False
        roots = [m for m in (ref() for ref in self._roots) if m is not None]
        if not roots:
            return
        for handle in self._global:
            handle.remove()
            self._handles.remove(handle)
        self._global = []
        for module in roots:
            self._handles.append(module.register_forward_pre_hook(self._module_pre))
            self._handles.append(module.register_forward_hook(self._module_post, always_call=True))
        self._narrow_accumulate()

    def _narrow_accumulate(self) -> None:
        """Keep the post-accumulate hooks only on the parameters accumulated last in a
        backward so far: the backward's end is theirs, and every other hook is a Python call
        from the autograd engine per parameter and step (~0.3-1 us each)."""
        lasts, self._acc_lasts = self._acc_lasts, None
        if not lasts or not lasts <= self._acc_handles.keys():
            return
        for key in list(self._acc_handles):
            if key not in lasts:
                handle = self._acc_handles.pop(key)
                handle.remove()
                self._handles.remove(handle)

    def remove(self) -> None:
        """Undo every hook and patch; safe to call twice."""
        self.active = False
        while self._handles:
            handle = self._handles.pop()
            handle.remove()
        unpatch(self._patches)

    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        patch(self._patches, owner, name, make)

    # ------------------------------------------------------------------ per-step data
    def take(self, end: Any) -> dict[str, list[Any]]:
        """This step's intervals, closed at ``end``; collectives still running carry over."""
        host = self.clock.host
        if self._fwd_open is not None:
            last = self._last_outer_end
            close = last if last is not None and host(last) >= host(self._fwd_open) else end
            self.intervals["forward"].append((self._fwd_open, close))
            self._fwd_open = None
        out = self.intervals
        comm, carry = [], []
        for record in out["communication"]:
            if record[1] is None:
                comm.append((record[0], end))
                carry.append(record)
            else:
                comm.append((record[0], record[1]))
        out["communication"] = comm
        self.intervals = _fresh()
        self.intervals["communication"] = carry
        return out

    def unresolved_points(self) -> list[str]:
        """fp_point / bp_point names that matched no module of any outermost module seen."""
        return [name for name, found in self._found.items() if not found] if self._seen else []

    def add_comm(self, record: list[Any]) -> None:
        """A collective started: ``record`` is ``[start, None]``, its end is filled in later."""
        self.intervals["communication"].append(record)

    # ------------------------------------------------------------------ hooks
    def _module_pre(self, module: Any, args: Any) -> None:
        self._depth += 1
        if self._depth != 1 or self._in_backward:
            return
        if id(module) not in self._seen:
            self._discover(module)
        self._on_outer(module)
        if not self.detailed:
            return
        now = None
        if self._opt_open is not None and self._opt_depth:
            now = self._pause_optimizer()
        if self._fwd_open is None and not (self.fp_point and self._found.get(self.fp_point)):
            self._fwd_open = now if now is not None else self.mark()

    def _pause_optimizer(self) -> Any:
        """The model runs inside ``optimizer.step(closure)`` (Lightning, LBFGS): the optimizer's
        interval ends here and resumes when the closure's backward ends, so the closure's
        forward and backward are timed as such, not as optimizer."""
        now = self.mark()
        self.intervals["optimizer"].append((self._opt_open, now))
        self._opt_open = None
        self._opt_paused = True
        return now

    def _module_post(self, module: Any, args: Any, output: Any) -> None:
        if self._depth > 0:
            self._depth -= 1
        if self._depth == 0:
            if not self._in_backward and self.detailed:
                self._last_outer_end = self.mark()
            if self._narrow_due:
                self.narrow()

    def _fp_pre(self, module: Any, args: Any) -> None:
        if self._fwd_open is None and not self._in_backward:
            self._fwd_open = self.mark()

    def _on_accumulate(self, param: Any) -> None:
        token = self.mark()
        self._acc_token = token
        self._acc_host = self.clock.host(token)
        self._acc_last = id(param)

    def _opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._opt_depth += 1
        if self._opt_depth == 1 and self.detailed:
            self._opt_open = self.mark()

    def _opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._opt_depth = max(0, self._opt_depth - 1)
        if self._opt_depth:
            return
        if self._opt_open is None and self._opt_paused:  # a closure without backward
            self._opt_open = self._last_outer_end
        if self._opt_open is not None:
            self.intervals["optimizer"].append((self._opt_open, self.mark()))
            self._opt_open = None
        self._opt_paused = False
        self._on_opt()

    # ------------------------------------------------------------------ wrappers
    def _wrap_timed(self, original: Any, phase: str, before: Hook) -> Any:
        timers = self

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not timers.active:
                return original(*args, **kwargs)
            before()
            start = timers.mark()
            try:
                return original(*args, **kwargs)
            finally:
                timers.intervals[phase].append((start, timers.mark()))

        return timed

    def _wrap_backward(self, original: Any) -> Any:
        timers = self

        @functools.wraps(original)
        def backward(*args: Any, **kwargs: Any) -> Any:
            if not timers.active or timers._in_backward:
                return original(*args, **kwargs)
            timers._poll()
            start = timers.mark()
            start_host = timers.clock.host(start)
            if timers._fwd_open is not None:
                timers.intervals["forward"].append((timers._fwd_open, start))
                timers._fwd_open = None
            timers._in_backward += 1
            try:
                return original(*args, **kwargs)
            finally:
                timers._in_backward -= 1
                end = done = timers.mark()
                if timers._acc_host >= start_host:
                    end = timers._acc_token
                    if timers._acc_lasts is not None:
                        timers._acc_lasts.add(timers._acc_last)
                timers.intervals["backward"].append((start, end))
                if timers._opt_paused and timers._opt_depth:
                    timers._opt_open = done  # the rest of optimizer.step() after its closure

        return backward

    # ------------------------------------------------------------------ discovery
    def _discover(self, module: Any) -> None:
        """First call of a new outermost module: resolve fp/bp points, hook parameters, DDP."""
        self._seen.add(id(module))
        self._roots.append(weakref.ref(module))
        if not self.detailed:
            return
        named = dict(module.named_modules())
        if self.fp_point:
            target = _lookup(named, self.fp_point)
            if target is not None and not self._found[self.fp_point]:
                self._found[self.fp_point] = True
                self._handles.append(target.register_forward_pre_hook(self._fp_pre))
        bp_module = module
        if self.bp_point:
            bp_module = _lookup(named, self.bp_point)
            if bp_module is None or self._found[self.bp_point]:
                bp_module = None
            else:
                self._found[self.bp_point] = True
        if bp_module is not None:
            for param in bp_module.parameters():
                if param.requires_grad and param.is_leaf and id(param) not in self._hooked:
                    self._hooked.add(id(param))
                    handle = param.register_post_accumulate_grad_hook(self._on_accumulate)
                    self._handles.append(handle)
                    self._acc_handles[id(param)] = handle
        from opscope.profile import comm

        note = comm.hook_ddp(module, self)
        if note:
            self.notes.append(note)


def _lookup(named: dict[str, Any], path: str) -> Any:
    """A module by path, also under a DDP/FSDP wrapper's ``module.`` prefix."""
    for candidate in (path, f"module.{path}", path.removeprefix("module.")):
        if candidate in named:
            return named[candidate]
    return None


Patch = tuple[Any, str, Any, Any]  # (owner, attribute name, original, wrapper)


def patch(patches: list[Patch], owner: Any, name: str, make: Callable[[Any], Any]) -> None:
    """Replace ``owner.name`` by ``make(original)`` and remember how to undo it in ``patches``."""
    original = owner.__dict__[name]
    wrapper = make(original)
    setattr(owner, name, wrapper)
    patches.append((owner, name, original, wrapper))


def unpatch(patches: list[Patch]) -> None:
    """Undo ``patches``, newest first; an attribute someone else replaced since is left alone."""
    while patches:
        owner, name, original, wrapper = patches.pop()
        if owner.__dict__.get(name) is wrapper:
            setattr(owner, name, original)
