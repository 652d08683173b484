"""What both callbacks do with the sessions they are given: start the ones not yet
started when training begins, end a step at each optimizer step, stop what they started.

A session is what ``opscope.dump(...)``, ``opscope.profile(...)`` or ``opscope.monitor(...)``
returns; only their public protocol is used (``__enter__``/``__exit__``, ``step()``).
"""

from __future__ import annotations

from typing import Any

from opscope.errors import ConfigError

ROLES = ("dump", "profile", "monitor")


def _not_started(session: Any) -> bool:
    """A session made but never started (profile: ``state == "new"``; dump, monitor:
    ``started`` is False)."""
    state = getattr(session, "state", None)
    if state is not None:
        return bool(state == "new")
    return getattr(session, "started", True) is False


def _check(role: str, session: Any) -> None:
    if session is not None and not callable(getattr(session, "step", None)):
        raise ConfigError(
            f"OpscopeCallback({role}=...) got {type(session).__name__}, not an opscope session; "
            f"pass what opscope.{role}(...) returns"
        )


class Sessions:
    """The dump, profile and monitor sessions one callback drives (each may be None).

    Args:
        dump, profile, monitor: sessions from ``opscope.dump/profile/monitor(...)``,
            started or not.
    """

    def __init__(self, dump: Any = None, profile: Any = None, monitor: Any = None) -> None:
        for role, session in zip(ROLES, (dump, profile, monitor)):
            _check(role, session)
        self.dump, self.profile, self.monitor = dump, profile, monitor
        self.owned: list[Any] = []  # started here, stopped here (newest first)
        self.monitor_due = False  # a step ended; the monitor's step() waits for its logged loss

    def begin(self) -> None:
        """Training begins: start each session not started yet (monitor first, profile
        last, so the profile's step 0 begins as close to the first step as it can)."""
        for session in (self.monitor, self.dump, self.profile):
            if session is not None and _not_started(session):
                session.__enter__()
                self.owned.insert(0, session)

    def end_step(self) -> None:
        """An optimizer step is done: the dump's and the profile's step ends here."""
        for session in (self.dump, self.profile):
            if session is not None:
                session.step()

    def monitor_step(self, loss: Any = None) -> None:
        """End the monitor's step with ``loss`` (None: no loss this step)."""
        self.monitor_due = False
        if self.monitor is not None:
            self.monitor.step(loss=loss)

    def finish(self, error: BaseException | None = None) -> None:
        """Training ended (``error``: it raised): stop the sessions started here."""
        if self.monitor_due:
            self.monitor_step()
        owned, self.owned = self.owned, []
        for session in owned:
            if error is None:
                session.__exit__(None, None, None)
            else:
                session.__exit__(type(error), error, error.__traceback__)


def logged_loss(logs: Any) -> float | None:
    """The ``loss`` a framework logged, as a float (None when absent or not a number; a NaN
    loss is kept: the monitor is there to see it)."""
    if not isinstance(logs, dict) or "loss" not in logs:
        return None
    try:
        return float(logs["loss"])
    except (TypeError, ValueError):
        return None
