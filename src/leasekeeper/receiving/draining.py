"""A graceful shutdown asked for from outside: ``drain(deadline)``, shared by the
workers (``Draining``, mixed into ``Worker`` and ``AsyncWorker``).

``worker.drain(deadline)`` starts the same shutdown as ``stop()`` or SIGTERM - no
more receives, running handlers go on while their leases are renewed, what is left
at the end is released - from any thread and without waiting for it, with a
deadline of its own on the worker's clock in place of ``shutdown_timeout``: an
interruption notice's time less a margin (``leasekeeper.fleet.interruption``). The
deadline (``DrainDeadline``, kept by the intake: ``shutdown_steps`` reads it again
after every change) only ever moves earlier. A signal that comes during such a
drain is a first signal - the deadline becomes ``shutdown_timeout`` from then if
that is sooner - not the second one that skips the wait.

``worker.listeners`` (``receiving.listeners``) are the intake's; the fleet options
``scale_in_protection=`` and ``interruption_notice=`` are taken from the workers'
keyword arguments here (``FLEET_OPTIONS``) and made listeners by
``leasekeeper.fleet.options``.
"""

from __future__ import annotations

import logging

from leasekeeper.clock import Clock
from leasekeeper.receiving._drain import FLEET_OPTIONS, DrainDeadline, fleet_options
from leasekeeper.receiving._intake import Intake
from leasekeeper.receiving._receive_loop import stop_notice
from leasekeeper.receiving.listeners import Listeners

__all__ = ["FLEET_OPTIONS", "DrainDeadline", "Draining", "fleet_options"]

log = logging.getLogger("leasekeeper.worker")


class Draining:
    """``drain(deadline)``, ``drain_deadline`` and ``listeners`` for a worker class
    (see the module docstring); the class gives ``intake``, ``clock`` and a
    thread-safe ``_stop_soon`` (by default its ``_request_stop``)."""

    intake: Intake
    clock: Clock

    @property
    def listeners(self) -> Listeners:
        """Who hears the receive loop's moments (``receiving.listeners``)."""
        return self.intake.listeners

    @property
    def drain_deadline(self) -> float | None:
        """The drain's deadline on the worker's clock, once ``drain()`` set one."""
        return self.intake.drain.deadline

    def drain(self, deadline: float | None = None) -> None:
        """Start the graceful shutdown and return at once (from any thread): nothing
        more is received; running handlers may finish until ``deadline`` (on
        ``worker.clock``; None: ``shutdown_timeout`` after the drain begins; only
        ever moved earlier), then what is left is released."""
        self.intake.drain.move(deadline)
        self._stop_soon()

    def _stop_soon(self) -> None:
        self._request_stop()

    def _request_stop(self) -> None:
        raise NotImplementedError

    def _second_signal(self, stopping: bool) -> bool:
        """A signal came: is it a second one (``DrainDeadline.second_signal``)?"""
        timed_out = self.clock.now() + self.intake.shutdown_timeout
        return self.intake.drain.second_signal(stopping, timed_out)

    def _say_signal(self, signum: int, second: bool, running: int) -> None:
        """Say, at WARNING, what the signal does: a second releases the running
        messages now; a first stops (``stop_notice``: for how long, and how to hurry)."""
        if second:
            log.warning("second signal %d: releasing running messages now", signum)
        else:
            log.warning(stop_notice(signum, running, self.intake.shutdown_timeout))
