"""Step boundaries, shared by dump, profile and watch. Pure logic: no torch here.

A step ends at the user's ``step()``; when the user never calls it, at each
``optimizer.step()``; with no optimizer, at each call of the outermost module.

An optimizer step only marks the boundary as *pending*: it is resolved at the next
event (the next outermost module call, the next captured op, ``step()`` or stop). So a
user who calls ``d.step()`` right after ``optimizer.step()`` gets one boundary, not two.
"""

from __future__ import annotations

from collections.abc import Callable


class StepClock:
    """Counts steps from the events the capture hooks feed it.

    Args:
        on_boundary: called as ``on_boundary(finished_step, next_step)`` at each boundary.
    """

    def __init__(self, on_boundary: Callable[[int, int], None] | None = None) -> None:
        self.step = 0
        self.manual = False
        self.pending = False
        self.saw_optimizer = False
        self._outer_calls = 0
        self._on_boundary = on_boundary

    def user_step(self) -> None:
        """The user called ``step()``: from now on only these calls end a step."""
        self.manual = True
        self.pending = False
        self._advance()

    def optimizer_step(self) -> None:
        """An ``optimizer.step()`` finished."""
        self.saw_optimizer = True
        if not self.manual:
            self.pending = True

    def outer_module_call(self) -> None:
        """The outermost module is about to be called."""
        self.poll()
        if not self.manual and not self.saw_optimizer and self._outer_calls:
            self._advance()
        self._outer_calls += 1

    def poll(self) -> None:
        """Resolve a pending boundary, if any. Cheap; call it at any safe point."""
        if self.pending:
            self.pending = False
            self._advance()

    def _advance(self) -> None:
        finished = self.step
        self.step += 1
        self._outer_calls = 0
        if self._on_boundary is not None:
            self._on_boundary(finished, self.step)
