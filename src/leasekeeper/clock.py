"""Time as leasekeeper sees it, injectable so tests can run hours in milliseconds.

Every component takes a ``Clock``. ``SystemClock`` is the real one. A clock that
also implements ``DrivenClock`` (``leasekeeper.testing.ManualClock``) moves only
when a test advances it; a LeaseManager on such a clock runs its scheduler from
``advance()`` in the test's thread instead of in a background thread, so every
extension that is due by the new time has happened when ``advance()`` returns.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds: what every deadline is measured in."""
        ...

    def wall(self) -> float:
        """Epoch seconds: only to convert a service's timestamps, never for deadlines."""
        ...

    def wait(self, condition: threading.Condition, timeout: float) -> bool:
        """Wait on ``condition`` (held by the caller) for at most ``timeout`` seconds.

        Returns True when notified. A driven clock returns at once: its time does
        not pass while a thread blocks.
        """
        ...


class SystemClock:
    """The real clock: ``time.monotonic`` for deadlines, ``time.time`` for conversions."""

    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def wait(self, condition: threading.Condition, timeout: float) -> bool:
        return condition.wait(max(0.0, timeout))

    def __repr__(self) -> str:
        return "SystemClock()"


class ClockDriven(Protocol):
    """What a driven clock calls back: something that has work at given times."""

    def next_wakeup(self) -> float | None:
        """The earliest clock time at which there is work, or None for none."""
        ...

    def run_due(self) -> None:
        """Do the work that is due at the clock's current time, and return when done."""
        ...


@runtime_checkable
class DrivenClock(Clock, Protocol):
    """A clock that moves only when told to and drives what is attached to it."""

    def attach(self, runner: ClockDriven) -> None: ...

    def detach(self, runner: ClockDriven) -> None: ...


SYSTEM_CLOCK = SystemClock()


def now_function(clock: Clock) -> Callable[[], float]:
    """``clock.now``, or ``time.monotonic`` itself for the system clock: the hot
    paths call it several times per lease and the method adds a Python frame."""
    return time.monotonic if type(clock) is SystemClock else clock.now


class Alarm:
    """A one-shot ``ClockDriven`` runner: calls ``ring()`` once a driven clock is
    advanced to ``at``. How a thread (or an event loop) waits for a moment of a
    ``ManualClock``: it blocks for real until the test moves time past it."""

    __slots__ = ("_ring", "at", "rung")

    def __init__(self, at: float, ring: Callable[[], object]) -> None:
        self.at = at
        self._ring = ring
        self.rung = False

    def next_wakeup(self) -> float | None:
        return None if self.rung else self.at

    def run_due(self) -> None:
        if not self.rung:
            self.rung = True
            self._ring()


def wait_until(clock: Clock, condition: threading.Condition, until: float | None) -> None:
    """Wait on ``condition`` (held by the caller) until it is notified, or until
    ``clock`` reads ``until`` (None: no limit).

    On a driven clock time passes only when a test advances it, so the thread blocks
    for real until it is notified or the clock is advanced to ``until`` - never in
    a loop that checks the time over and over.
    """
    if until is None:
        condition.wait()
        return
    # the system clock first: a runtime protocol check walks the protocol's
    # attributes, and the receive loops and the dispatcher wait here all day
    if type(clock) is SystemClock or not isinstance(clock, DrivenClock):
        clock.wait(condition, until - clock.now())
        return
    if clock.now() >= until:
        return

    def ring() -> None:
        with condition:
            condition.notify_all()

    alarm = Alarm(until, ring)
    clock.attach(alarm)
    try:
        if clock.now() < until:  # advanced past it between the check and the attach?
            condition.wait()
    finally:
        clock.detach(alarm)
