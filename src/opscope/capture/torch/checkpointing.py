"""Activation checkpointing's recomputation, marked while a dump runs.

``torch.utils.checkpoint`` (Hugging Face's gradient checkpointing, ``checkpoint_sequential``)
keeps a block's inputs instead of its activations and, inside the backward, runs the block's
function again to remake what a backward node needs. Both variants keep that function where
this module can reach it: the non-reentrant one in the frame it makes per call
(``_CheckpointFrame.recompute_fn``, called from its saved-tensor unpack hook), the reentrant
one in its autograd Function's context (``CheckpointFunction.forward`` stores
``run_function``, which its ``backward`` calls again). While a dump runs, both are wrapped so
that a call made inside the autograd engine's backward is recorded as a recomputation: its
ops are phase ``recompute``, under the modules they run in; those outside its submodules are
the module whose code called the checkpoint in the forward (Hugging Face checkpoints a
layer's ``forward``, not its call, so the layer's own hooks do not run again), as they were
there (docs/dump.md, "Activation checkpointing").

The originals go back when the dump stops; a torch without these names keeps its default (a
recomputation is then recorded as the backward node's ops). Nothing is wrapped while dynamo
traces (it turns a checkpoint into its own higher-order op).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

_graph_task = torch._C._current_graph_task_id  # -1 outside the autograd engine's backward
_is_compiling = torch.compiler.is_compiling


class Recomputations:
    """Wraps torch's two checkpoint variants so that ``session`` records their recomputations."""

    def __init__(self, session: Any) -> None:
        self.session = session  # a DumpSession (phase, modules, level, capturing, recompute_node)
        self._before: list[tuple[str, int]] = []  # (phase, module stack depth) each recomputation interrupted
        self._saved: list[tuple[Any, str, Any]] = []  # (owner, attribute, original)

    def install(self) -> None:
        if self._saved:
            return
        try:
            from torch.utils import checkpoint as ck

            frame_init, function_forward = ck._CheckpointFrame.__init__, ck.CheckpointFunction.forward
        except (ImportError, AttributeError):  # pragma: no cover - a torch without them
            return
        marked = self._marked

        def init(frame: Any, recompute_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
            frame_init(frame, recompute_fn if _is_compiling() else marked(recompute_fn), *args, **kwargs)

        def forward(ctx: Any, run_function: Callable[..., Any], *args: Any) -> Any:
            return function_forward(ctx, run_function if _is_compiling() else marked(run_function), *args)

        self._saved = [(ck._CheckpointFrame, "__init__", frame_init),
                       (ck.CheckpointFunction, "forward", ck.CheckpointFunction.__dict__["forward"])]
        ck._CheckpointFrame.__init__ = init  # type: ignore[method-assign,assignment]
        ck.CheckpointFunction.forward = staticmethod(forward)  # type: ignore[method-assign]

    def remove(self) -> None:
        for owner, name, original in self._saved:
            setattr(owner, name, original)
        self._saved = []

    def _marked(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, telling the session when it runs inside the backward: a recomputation (the
        reentrant variant's forward also calls it, outside the backward: as it is), and the
        module path it is wrapped in (the checkpoint's caller, in the forward)."""
        on_recompute, path = self._recompute, self.session.modules.path

        @functools.wraps(fn)
        def recompute(*args: Any, **kwargs: Any) -> Any:
            if _graph_task() < 0:
                return fn(*args, **kwargs)
            on_recompute(path)
            try:
                return fn(*args, **kwargs)
            finally:  # also when torch stops it early (it raises from inside once it has what it needs)
                on_recompute(None)

        return recompute

    def _recompute(self, path: str | None) -> None:
        """A recomputation starts (``path``: the module that called the checkpoint in the
        forward) or ends (None). Its ops are ``recompute`` (selected with ``backward``), in that
        module but for its submodules'; then the phase it interrupted goes on."""
        s = self.session
        if path is not None:
            self._before.append((s.phase, len(s.modules.stack)))
            s.phase = "recompute"
            s.recompute_node = torch._C._current_autograd_node()
            s.modules.set_inner(len(s.modules.stack), path)
        else:
            s.phase, depth = self._before.pop() if self._before else ("backward", 0)
            s.modules.set_inner(depth, None)
        level = s.level
        if level is not None:
            if s.capturing:
                level.set_phase(s.phase)
            level.recompute(path is not None)
