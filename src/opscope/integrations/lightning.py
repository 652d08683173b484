"""``OpscopeCallback`` for Lightning's ``Trainer``: dump, profile and monitor steps are the
optimizer steps (``trainer.global_step``).

>>> trainer = lightning.pytorch.Trainer(max_steps=100,  # doctest: +SKIP
...     callbacks=[OpscopeCallback(profile=opscope.profile("prof", steps="5-6"))])
>>> trainer.fit(module, loader)  # doctest: +SKIP

Under ``accumulate_grad_batches=k`` the k batches of one optimizer step are one step. The
sessions not started yet start at ``on_train_start`` and stop at ``on_train_end``, or at
``on_exception`` with the error. Works with ``lightning`` (``lightning.pytorch``) and, when
only that is installed, the standalone ``pytorch_lightning``; :func:`callback_class` makes
the class for the other one when both are.
"""

from __future__ import annotations

from typing import Any

from opscope.integrations._sessions import Sessions


def _loss_of(outputs: Any) -> Any:
    """The loss in what ``training_step`` returned (Lightning divides it by the
    accumulation count already), detached; None when there is none."""
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    detach = getattr(loss, "detach", None)
    return detach() if detach is not None else loss


class _Driver:
    """The callback's logic, free of Lightning's base class (mixed in by :func:`callback_class`)."""

    def __init__(self, dump: Any = None, profile: Any = None, monitor: Any = None) -> None:
        super().__init__()
        self.sessions = Sessions(dump, profile, monitor)
        self._global_step = 0
        self._loss: Any = None  # summed over the step's batches

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._global_step = trainer.global_step
        self._loss = None
        self.sessions.begin()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = _loss_of(outputs)
        if loss is not None:
            self._loss = loss if self._loss is None else self._loss + loss
        if trainer.global_step == self._global_step:
            return  # a micro-batch of an accumulating step (or a skipped step)
        self._global_step = trainer.global_step
        self.sessions.end_step()
        loss, self._loss = self._loss, None
        self.sessions.monitor_step(loss)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.sessions.finish()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.sessions.finish(exception)


def callback_class(base: type) -> type:
    """An ``OpscopeCallback`` class on ``base`` (``lightning.pytorch.Callback`` or
    ``pytorch_lightning.Callback``: a Trainer accepts only its own package's callbacks)."""
    return type("OpscopeCallback", (_Driver, base), {"__module__": __name__, "__doc__": _DOC})


_DOC = """Ends opscope's steps at Lightning's optimizer steps.

    Args:
        dump: an ``opscope.dump(...)`` session (started or not), or None.
        profile: an ``opscope.profile(...)`` session, or None.
        monitor: an ``opscope.monitor(...)`` session, or None. Its loss is the step's loss
            returned by ``training_step`` (summed over accumulated batches, which Lightning
            divides by their count); the learning rate is read from the optimizer by the
            monitor itself.
    """


def _default_base() -> type:
    import importlib

    try:
        module = importlib.import_module("lightning.pytorch")
    except ImportError:
        module = importlib.import_module("pytorch_lightning")
    base: type = module.Callback
    return base


OpscopeCallback = callback_class(_default_base())
