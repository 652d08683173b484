"""What mixed precision's loss scaling did, for a module-level dump, which records no op.

``torch.amp.GradScaler`` multiplies the loss by its scale S, so every gradient a module-level
dump records in backward is S times its true value, and unscales the gradients before the
optimizer reads them (skipping the update where one is Inf or NaN). At the aten level the
scaler's own ops say all this; a module-level dump records two calls in their place, so
that a comparison can divide S out and see a skipped step (:mod:`opscope.compare.loss_scale`):

- ``GradScaler.scale``: inputs the loss and the scale, output the scaled loss;
- ``GradScaler.unscale_``: input the inverse scale the gradients were multiplied by, output
  ``found_inf`` (above 0: the scaler skips this step's update).

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
        scale, unscale = self._originals["scale"], self._originals["unscale_"]
        hooks = self

        def scaled(scaler: Any, outputs: Any) -> Any:
            out = scale(scaler, outputs)
            hooks._guarded(hooks._record_scale, scaler, outputs, out)
            return out

        def unscaled(scaler: Any, optimizer: Any) -> None:
            unscale(scaler, optimizer)
            hooks._guarded(hooks._record_unscale, scaler, optimizer)

        cls.scale, cls.unscale_ = scaled, unscaled

    def remove(self) -> None:
        cls = _scaler_class()
        if cls is not None and self._originals:
            cls.scale, cls.unscale_ = self._originals["scale"], self._originals["unscale_"]
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

    def _record_unscale(self, scaler: Any, optimizer: Any) -> None:
        scale = getattr(scaler, "_scale", None)
        states = getattr(scaler, "_per_optimizer_states", {})
        found = states.get(id(optimizer), {}).get("found_inf_per_device")
        if scale is None or not found:
            return
        with torch.no_grad():
            inverse = scale.double().reciprocal().float()  # what unscale_ multiplied the gradients by
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
