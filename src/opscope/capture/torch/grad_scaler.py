"""What mixed precision's loss scaling did, for a module-level dump, which records no op.

``torch.amp.GradScaler`` multiplies the loss by its scale S, so every gradient a module-level
dump records in backward is S times its true value, and unscales the gradients before the
optimizer reads them (skipping the update where one is Inf or NaN). At the aten level the
scaler's own ops say all this; a module-level dump records two calls in their place, so
that a comparison can divide S out and see a skipped step (:mod:`opscope.compare.loss_scale`):

- ``GradScaler.scale``: inputs the loss and the scale, output the scaled loss;
- ``GradScaler.unscale_``: input the inverse scale the gradients were multiplied by, output
  ``found_inf`` (above 0: the scaler skips this step's update). A fused optimizer
  (``AdamW(fused=True)``) unscales the gradients itself: ``GradScaler.step`` then only checks
  them, recorded the same way with 1 for the inverse scale.

The two methods are wrapped on the class while the dump runs (every scaler of the process)
and put back when it stops; a failure here stops capture, never the user's step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from opscope.errors import OpscopeError

if TYPE_CHECKING:
    from opscope.capture.torch.host import CaptureHost

SCALE, UNSCALE = "GradScaler.scale", "GradScaler.unscale_"


class ScalerHooks:
    """Wraps ``GradScaler.scale`` and ``GradScaler.unscale_`` to record them for ``session``."""

    def __init__(self, session: CaptureHost) -> None:
        self.session = session
        self._originals: dict[str, Any] = {}

    def install(self) -> None:
        cls = _scaler_class()
        if cls is None or self._originals:
            return
        self._originals = {"scale": cls.scale, "unscale_": cls.unscale_}
        check: Any = getattr(cls, "_check_inf_per_device", None)  # (torch 2.x; private)
        if check is not None:
            self._originals["_check_inf_per_device"] = check
        scale, unscale = self._originals["scale"], self._originals["unscale_"]
        hooks = self

        def scaled(scaler: Any, outputs: Any) -> Any:
            out = scale(scaler, outputs)
            hooks._guarded(hooks._record_scale, scaler, outputs, out)
            return out

        def unscaled(scaler: Any, optimizer: Any) -> None:
            unscale(scaler, optimizer)
            hooks._guarded(hooks._record_unscale, scaler, optimizer)

        def checked(scaler: Any, optimizer: Any) -> Any:
            found = check(scaler, optimizer)
            hooks._guarded(hooks._record_unscale, scaler, optimizer, True)
            return found

        cls.scale, cls.unscale_ = scaled, unscaled
        if check is not None:
            cls._check_inf_per_device = checked

    def remove(self) -> None:
        cls = _scaler_class()
        if cls is not None and self._originals:
            for name, original in self._originals.items():
                setattr(cls, name, original)
        self._originals = {}

    def _guarded(self, fn: Any, *args: Any) -> None:
        s = self.session
        if not s.capturing:
            return
        try:
            fn(*args)
        except OpscopeError:
            raise
        except Exception as exc:
            s.internal_error(exc)

    def _record_scale(self, scaler: Any, outputs: Any, out: Any) -> None:
        scale = getattr(scaler, "_scale", None)
        if not (isinstance(outputs, torch.Tensor) and isinstance(out, torch.Tensor)) or scale is None \
                or out is outputs:  # disabled, or a structure of outputs: nothing to record
            return
        self._record(SCALE, [(0, None, outputs.detach()), (1, None, scale)], [(0, None, out.detach())])

    def _record_unscale(self, scaler: Any, optimizer: Any, checked_only: bool = False) -> None:
        """``checked_only``: the gradients were only checked (a fused optimizer's step)."""
        scale = getattr(scaler, "_scale", None)
        states = getattr(scaler, "_per_optimizer_states", {})
        found = states.get(id(optimizer), {}).get("found_inf_per_device")
        if scale is None or not found:
            return
        with torch.no_grad():
            # what unscale_ multiplied the gradients by
            inverse = torch.ones((), dtype=torch.float32) if checked_only else scale.double().reciprocal().float()
            found_inf = sum(v.to("cpu", torch.float32) for v in found.values())
        self._record(UNSCALE, [(0, None, inverse)], [(0, None, found_inf)])

    def _record(self, op: str, inputs: list[Any], outputs: list[Any]) -> None:
        s = self.session
        level = s.level
        if level is not None and s.recorder.selected("", op, s.phase):
            level.record_graph(op, "", s.phase, inputs, outputs)


def _scaler_class() -> Any:
    amp = getattr(torch, "amp", None)
    return getattr(amp, "GradScaler", None)
