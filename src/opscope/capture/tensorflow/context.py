"""Where an op runs: its Keras layer path and its phase, from three patched methods.

While a dump runs, ``keras.layers.Layer.__call__`` keeps a stack of the layers being called,
``tf.GradientTape.gradient`` marks what it builds or runs as ``backward`` and Keras'
optimizer ``apply`` marks it ``optimizer``. In a ``tf.function`` these run while the graph
is traced, so each op's layer and phase are known when its plan is made; eager ops read
them when they run. Every patch is undone by :meth:`CallContext.uninstall`, also when the
user's code raised.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable
from typing import Any

BACKWARD_SCOPE = "gradient_tape/"


class CallContext:
    """The layer stack and phase of the calling thread, and the patches that keep them.

    Args:
        on_layer: ``on_layer(layer, path, args, kwargs, outputs)`` after each layer call
            (layer-level capture), or None.
        on_apply: ``on_apply(optimizer, grads, variables)`` before an optimizer applies
            gradients (the ``grad`` rows), or None.
        on_step: called after an optimizer applied gradients eagerly (a step boundary).
    """

    def __init__(self, on_layer: Callable[..., None] | None = None,
                 on_apply: Callable[..., None] | None = None,
                 on_step: Callable[[], None] | None = None) -> None:
        self._local = threading.local()
        self.on_layer, self.on_apply, self.on_step = on_layer, on_apply, on_step
        self._undo: list[Callable[[], None]] = []

    # -- state -------------------------------------------------------------------------
    @property
    def stack(self) -> list[Any]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    @property
    def phase(self) -> str:
        return getattr(self._local, "phase", "forward")

    def set_phase(self, phase: str) -> str:
        old = self.phase
        self._local.phase = phase
        return old

    def module(self) -> str:
        """The layer path of the innermost layer being called (``""`` outside any layer):
        layer names from the outermost model down, the model itself left out."""
        return layer_path(self.stack)

    # -- patches -----------------------------------------------------------------------
    def install(self) -> None:
        import keras
        import tensorflow as tf

        self._patch(keras.layers.Layer, "__call__", self._layer_call)
        self._patch(tf.GradientTape, "gradient", self._gradient)
        from keras.src.optimizers.base_optimizer import BaseOptimizer

        self._patch(BaseOptimizer, "apply", self._apply)

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _patch(self, owner: type, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        original = owner.__dict__[name]
        wrapper = make(original)
        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(owner, name, wrapper)
        self._undo.append(lambda: setattr(owner, name, original))

    def _layer_call(self, original: Callable[..., Any]) -> Callable[..., Any]:
        ctx = self

        def __call__(layer: Any, *args: Any, **kwargs: Any) -> Any:
            stack = ctx.stack
            stack.append(layer)
            try:
                outputs = original(layer, *args, **kwargs)
                if ctx.on_layer is not None and ctx.phase == "forward":
                    ctx.on_layer(layer, layer_path(stack), args, kwargs, outputs)
                return outputs
            finally:
                stack.pop()
        return __call__

    def _gradient(self, original: Callable[..., Any]) -> Callable[..., Any]:
        ctx = self

        def gradient(tape: Any, *args: Any, **kwargs: Any) -> Any:
            old = ctx.set_phase("backward")
            try:
                return original(tape, *args, **kwargs)
            finally:
                ctx.set_phase(old)
        return gradient

    def _apply(self, original: Callable[..., Any]) -> Callable[..., Any]:
        ctx = self

        def apply(optimizer: Any, grads: Any, trainable_variables: Any = None) -> Any:
            old = ctx.set_phase("optimizer")
            try:
                if ctx.on_apply is not None:
                    ctx.on_apply(optimizer, grads, trainable_variables)
                out = original(optimizer, grads, trainable_variables)
            finally:
                ctx.set_phase(old)
            if ctx.on_step is not None:
                ctx.on_step()
            return out
        return apply


def layer_path(stack: list[Any]) -> str:
    """Layer names joined by ``.``, the outermost model left out (as ``named_modules``)."""
    if not stack:
        return ""
    import keras

    names = [layer.name for layer in stack]
    if isinstance(stack[0], keras.Model) and len(names) > 1:
        names = names[1:]
    elif isinstance(stack[0], keras.Model):
        return ""
    # a layer reached twice in a row (a layer's __call__ calling its own super().__call__)
    out = [n for i, n in enumerate(names) if i == 0 or stack[i] is not stack[i - 1]]
    return ".".join(out)


def variable_names(*owners: Any) -> dict[int, str]:
    """``id(resource handle) -> variable path`` for the variables of Keras models/optimizers."""
    names: dict[int, str] = {}
    for owner in owners:
        owned = list(getattr(owner, "variables", None) or [])
        with contextlib.suppress(Exception):  # a model not built yet
            # a model's metric state (the loss tracker's total and count) carries over steps too
            owned += list(getattr(owner, "metrics_variables", None) or [])
        for var in owned:
            handle = resource_handle(var)
            if handle is not None:
                names[id(handle)] = str(getattr(var, "path", None) or getattr(var, "name", ""))
    return names


def resource_handle(var: Any) -> Any:
    """The resource handle of a Keras variable (its ``tf.Variable``) or of a ``tf.Variable``."""
    inner = getattr(var, "_value", None)
    handle = getattr(inner, "handle", None)
    return handle if handle is not None else getattr(var, "handle", None)


def layer_args(layer: Any) -> str | None:
    """The settings of a Keras layer that a comparison with a PyTorch port needs, as JSON:
    the activation it applies to its output (Dense, Conv) and its ``data_format``."""
    out: dict[str, str] = {}
    activation = getattr(layer, "activation", None)
    name = getattr(activation, "__name__", None)
    if isinstance(name, str) and name != "linear":
        out["activation"] = name
    data_format = getattr(layer, "data_format", None)
    if isinstance(data_format, str):
        out["data_format"] = data_format
    return json.dumps(out, sort_keys=True) if out else None
