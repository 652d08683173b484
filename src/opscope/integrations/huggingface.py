"""``OpscopeCallback`` for ``transformers.Trainer``: dump, profile and monitor steps are the
Trainer's optimizer steps.

>>> trainer = Trainer(model, args, train_dataset=ds,  # doctest: +SKIP
...                   callbacks=[OpscopeCallback(profile=opscope.profile("prof", steps="5-6"),
...                                              monitor=opscope.monitor("mon"))])
>>> trainer.train()  # doctest: +SKIP

Under gradient accumulation the k micro-batches of one optimizer step are one step. The
sessions not started yet start at ``on_train_begin`` and stop at ``on_train_end`` (a
Trainer that raises never calls it: start them yourself with ``with`` around
``trainer.train()`` to have them stopped then too).
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from opscope.integrations._sessions import Sessions, logged_loss


class OpscopeCallback(TrainerCallback):
    """Ends opscope's steps at the Trainer's optimizer steps.

    Args:
        dump: an ``opscope.dump(...)`` session (started or not), or None.
        profile: an ``opscope.profile(...)`` session, or None.
        monitor: an ``opscope.monitor(...)`` session, or None. Its loss is the ``loss`` the
            Trainer logs (``logging_steps=1`` gives one every step; a step that logs
            nothing has no loss; with ``logging_steps=n`` it is the mean over n steps); the
            learning rate is read from the optimizer by the monitor itself, as the step used it.
    """

    def __init__(self, dump: Any = None, profile: Any = None, monitor: Any = None) -> None:
        self.sessions = Sessions(dump, profile, monitor)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.sessions.begin()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.sessions.monitor_due:  # the last step logged no loss
            self.sessions.monitor_step()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # After optimizer.step(), lr_scheduler.step() and model.zero_grad(); before logging,
        # evaluation and saving, which fall in the next step.
        self.sessions.end_step()
        if self.sessions.monitor is None:
            return
        if getattr(control, "should_log", False):  # on_log comes next, before any evaluation
            self.sessions.monitor_due = True
        else:
            self.sessions.monitor_step()

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        loss = logged_loss(logs)
        if self.sessions.monitor_due and loss is not None:
            self.sessions.monitor_step(loss)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.sessions.finish()
