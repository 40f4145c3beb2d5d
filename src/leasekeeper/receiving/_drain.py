"""The deadline of a drain and the fleet options, as the intake keeps them (the
workers' side is ``receiving.draining``)."""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["FLEET_OPTIONS", "DrainDeadline", "fleet_options"]

#: The workers' keyword arguments for an elastic fleet (``leasekeeper.fleet.options``).
FLEET_OPTIONS = ("scale_in_protection", "interruption_notice")


def fleet_options(fields: dict[str, Any]) -> dict[str, Any]:
    """Take the fleet options out of a worker's keyword arguments (the rest are the
    ``LeaseConfig`` fields)."""
    return {name: fields.pop(name) for name in FLEET_OPTIONS if name in fields}


class DrainDeadline:
    """When a drain must end (``deadline``, None: ``shutdown_timeout`` after it
    begins), and whether a signal was seen; thread-safe (a signal handler may call
    it while the same thread holds it: a reentrant lock)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.deadline: float | None = None
        self._signalled = False

    def move(self, deadline: float | None) -> None:
        """Make ``deadline`` the drain's, unless an earlier one is set (None: none)."""
        if deadline is None:
            return
        with self._lock:
            before = self.deadline
            self.deadline = deadline if before is None else min(before, deadline)

    def second_signal(self, stopping: bool, timed_out: float) -> bool:
        """A signal came (``stopping``: a stop was asked before it): True when it is a
        second one, which skips the wait. The first during a drain with a deadline
        moves the deadline to ``timed_out`` if that is sooner."""
        with self._lock:
            noticed = self.deadline is not None and not self._signalled
            self._signalled = True
            if noticed:
                self.move(timed_out)
                return False
        return stopping
