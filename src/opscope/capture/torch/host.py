"""What the capture levels need from the session that owns them, as Protocols.

The levels (``levels``, ``dispatch``, ``native.aten``, ``native.module``) and the
torch.compile watch (``compiled``) are built by :class:`~opscope.capture.torch.session.DumpSession`
and call back into it. They see it through :class:`CaptureHost`, so none of them imports
the session module: imports in ``capture/torch`` run one way, session → levels → here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

    from opscope.capture.torch.modules import ModuleTracker
    from opscope.capture.torch.recorder import Recorder
    from opscope.config import DumpConfig

# One captured tensor of a compiled graph's inputs or outputs: (slot, argument name, tensor).
GraphItem = tuple[int, "str | None", "torch.Tensor"]


class GraphLevel(Protocol):
    """The part of a capture level that the session's phase changes and compiled graphs reach."""

    def set_phase(self, phase: str) -> None: ...

    def stop_capture(self) -> None: ...

    def record_graph(self, op: str, path: str, phase: str, inputs: Sequence[GraphItem],
                     outputs: Sequence[GraphItem], call: int = -1) -> int: ...


class CaptureHost(Protocol):
    """The session as its levels see it (implemented by ``DumpSession``)."""

    cfg: DumpConfig
    recorder: Recorder
    modules: ModuleTracker
    rank: int
    phase: str
    capturing: bool
    collective_depth: int  # inside a torch.distributed collective's call (capture/torch/collectives.py)
    started: bool
    failure: BaseException | None
    recompute_node: Any  # the autograd node a recomputation (activation checkpointing) runs inside

    @property
    def level(self) -> GraphLevel | None:
        """The active capture level, None before start."""

    def internal_error(self, exc: BaseException) -> None:
        """Stop capturing after an error inside opscope; the user's run goes on."""

    def backward_ran(self) -> None:
        """An autograd backward op ran (the session moves its phase to backward)."""

    def source(self) -> str | None:
        """The user's source line of the current op, when ``cfg.source`` is set."""

