"""The aten-level watch run natively: a C++ ``at::RecordFunction`` observer (``_c/watchobs.cpp``,
built on first use by :mod:`opscope.capture.torch.native.build`) does the per-op work of
:class:`~opscope.watch.check.Checker` — one fused range pass per output, the
mask and propagation marks, the entries for the chain back — without entering Python per op.
A Python :class:`~torch.utils._python_dispatch.TorchDispatchMode` alone costs more than the
whole native check (see benchmarks/bench_watch.py).

Python keeps the rules (which ops are views, casts, select ops, additive-mask ops: asked once
per overload) and everything done on a hit. Tensor identities are ``TensorImpl`` addresses
(``tensor._cdata``) instead of ``id(tensor)``.

What is observed is the outermost op of each call on the watching thread and its autograd
threads, forward, backward (ops run inside an autograd node; attributed to the forward op
with the node's sequence number) and the optimizer. Ops that run inside another op — a
composite op's decomposition, a kernel's helpers — are part of the outer op: a NaN made
inside ``linear`` is reported as ``aten.linear``. ``OPSCOPE_WATCH_BACKEND=python`` selects
the Python dispatch mode instead (it sees the decomposed ops).

A hit found inside an op cannot raise through the op (torch swallows observer errors):
``action="raise"`` raises at the next module call or return, optimizer step or ``step()``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch

from opscope.capture.torch.native import build as native
from opscope.capture.torch.native.ops import classify_op
from opscope.config import PHASE_CODES, PHASES, env
from opscope.watch.check import Checker, Describe

log = logging.getLogger("opscope.watch")
_DTYPES = {"Float": torch.float32, "Double": torch.float64, "Half": torch.float16, "BFloat16": torch.bfloat16}
_NODE_PREFIX = "autograd::engine::evaluate_function: "
_warned = False


def load_backend() -> Any:
    """The native module, or None when ``OPSCOPE_WATCH_BACKEND=python`` or it cannot be built
    (then said once, with the reason)."""
    global _warned
    choice = (env("WATCH_BACKEND") or "native").lower()
    if choice == "python":
        return None
    module = native.load("_opscope_watch")
    if module is None and not _warned:
        _warned = True
        log.warning("opscope watch: the native aten observer is not available (%s); using the slower "
                    "Python dispatch mode. Install a C++ compiler (g++) to get it.", native.error("_opscope_watch"))
    return module


class NativeChecker(Checker):
    """:class:`Checker` whose per-op work and entries live in the native observer.

    With ``ops=False`` (module level) the per-op observer is never registered: only
    :meth:`observe` and the range passes are native (entries, marks and judging in C++).
    """

    _registered: bool  # whether the per-op observer is registered; set by install()

    def __init__(self, modules: Any, limit: float | None, on_hit: Callable[..., None], backend: Any,
                 ops: bool = True) -> None:
        self._n = backend
        self._ops = ops
        self._on = self._ops_on = self._defer = False
        self._hush = 0  # > 0 while opscope runs its own torch ops
        self._phase = "forward"
        self._paths: dict[str, int] = {"": -1}
        self._path_list: list[str] = []
        self.raised: BaseException | None = None
        self._call_args: Any = None  # the inputs of the module call being observed
        super().__init__(modules, limit, on_hit)
        self.ident = _ident
        self.range_of, self.ranges_of = backend.range_of, backend.ranges_of

    # -- configuration pushed to the observer ---------------------------------------------
    def _push(self) -> None:
        if hasattr(self, "limit"):
            self._n.configure(self._on and self._ops_on and not self._hush, PHASE_CODES[self._phase],
                              self._defer, self.limit)

    on = property(lambda self: self._on, lambda self, v: self._set("_on", v))
    ops_on = property(lambda self: self._ops_on, lambda self, v: self._set("_ops_on", v))
    defer = property(lambda self: self._defer, lambda self, v: self._set("_defer", v))
    phase = property(lambda self: self._phase, lambda self, v: self._set("_phase", v))

    def _set(self, name: str, value: Any) -> None:
        setattr(self, name, value)
        self._push()
        if name in ("_on", "_ops_on") and self._ops and hasattr(self, "_registered"):
            wanted = self._on and self._ops_on
            if wanted != self._registered:  # changed between steps or around the optimizer step only
                self._registered = wanted
                self._n.register(wanted)

    def install(self) -> None:
        self._n.install(self._native_hit, classify_op)
        self._registered = self._ops and self._on and self._ops_on
        self._n.register(self._registered)
        self._push()

    def uninstall(self) -> None:
        self._n.uninstall()

    def _path_index(self, path: str) -> int:
        index = self._paths.get(path)
        if index is None:
            index = self._paths[path] = len(self._path_list)
            self._path_list.append(path)
        return index

    def module_changed(self, path: str) -> None:
        """The module being executed (a module was entered or left)."""
        self._n.set_module(self._path_index(path))

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """opscope's own torch ops in this block are not observed."""
        self._hush += 1
        self._push()
        try:
            yield
        finally:
            self._hush -= 1
            self._push()

    # -- the Checker interface -------------------------------------------------------------
    def reset(self) -> None:
        if hasattr(self, "_n"):
            self._n.reset()
        self.groups: list[tuple[str, str, list[torch.Tensor], Describe, list[int], torch.Tensor]] = []
        self.params: dict[int, str] = {}
        self.inputs: dict[int, list[tuple[str, torch.Tensor]]] = {}

    @property
    def entries(self) -> list[list[Any]]:  # type: ignore[override]  # read from the native observer, never set
        """The step's entries as the chain code reads them (converted on each read: on hits;
        ranges read at the step's end fill in later, so nothing is cached)."""
        entries = self._n.entries(0)
        for e in entries:
            e[1] = self._path_list[e[1]] if e[1] >= 0 else ""
            e[2] = PHASES[e[2]]
            if e[4] is not None:
                e[4] = e[4].removeprefix(_NODE_PREFIX)
            for rec in e[6]:
                t = rec[1]
                rec[1] = (lambda t=t: t) if t is not None else None
                rec[5] = _DTYPES.get(rec[5], rec[5])
        return entries

    def count(self) -> int:
        return self._n.count()

    @property
    def pending(self) -> int:  # type: ignore[override]  # read from the native observer, never set
        return self._n.pending()

    def observe(self, name: str, module: str, phase: str, fwd: str | None, node: str | None,
                in_ids: tuple[int, ...], outs: Any, args: Any = None, *, check: bool = True,
                select: bool = False, strict: bool = False) -> int:
        self.module_changed(module)
        index = self._n.observe(name, self._paths[module], PHASE_CODES[phase], tuple(in_ids), list(outs),
                                check, select, strict)
        self.module_changed(self.modules.path)
        self.reraise()
        return index

    def observe_module(self, name: str, path: str, phase: str, in_ids: tuple[int, ...], outs: Any,
                       args: Any) -> None:
        """One module call's outputs (module level: no per-op observer to tell the module);
        ``args`` (the call's inputs) are shown on a hit."""
        self._call_args = args
        try:
            self._n.observe(name, self._path_index(path), PHASE_CODES[phase], in_ids, outs, True, False, False)
        finally:
            self._call_args = None
        if self.raised is not None:
            self.reraise()

    def group(self, label: str, phase: str, tensors: list[torch.Tensor], describe: Callable[..., Any]) -> None:
        with self.quiet():
            super().group(label, phase, tensors, describe)

    def resolve(self) -> None:
        self._resolve_groups()
        self._n.resolve()
        self.reraise()

    # -- hits ----------------------------------------------------------------------------
    def _native_hit(self, index: int, slot: int, kind: str, t: torch.Tensor | None, args: Any) -> None:
        if self.raised is not None:
            return
        try:
            with self.quiet():
                self.on_hit(index, slot, kind, t, args if args is not None else self._call_args)
        except BaseException as exc:  # raised later, where Python can: see reraise()
            self.raised = exc

    def reraise(self) -> None:
        """Raise what a hit inside an op could not raise there."""
        exc, self.raised = self.raised, None
        if exc is not None:
            raise exc


def _ident(t: torch.Tensor) -> int:
    return t._cdata


def param_names_by_impl(roots: list[Any]) -> dict[int, str]:
    """Parameter and buffer names keyed by ``TensorImpl`` address (the native identity)."""
    names: dict[int, str] = {}
    for ref in roots:
        root = ref()
        if root is None:
            continue
        for name, p in root.named_parameters(remove_duplicate=False):
            names.setdefault(p._cdata, name)
        for name, b in root.named_buffers(remove_duplicate=False):
            names.setdefault(b._cdata, name)
    return names
