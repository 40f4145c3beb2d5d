"""Observers: what a LeaseManager tells instrumentation as it works.

Subclass ``Observer``, override what you need, and ``manager.add_observer(it)``.
``leasekeeper.otel`` is one; a test's recorder or a timeline drawing is another.
The manager calls observers on its own threads (the scheduler's, the dispatch
pool's) and on the handler's thread for completes and releases, so a callback
must be quick and thread-safe. One that raises is logged and counted in
``stats().callback_errors``; it never reaches the manager. With no observer the
manager does no timing at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from leasekeeper.backends.contract import Backend
    from leasekeeper.record import LeaseRecord, LeaseState

__all__ = ["CallEvent", "Observer"]


@dataclass(frozen=True)
class CallEvent:
    """One backend call the manager made: an extend, delete or release of ``entries``
    messages, which took ``seconds``.

    ``outcomes`` has one kind per entry ("ok", "lost", "retry", "capped", "fatal").
    ``error`` names what went wrong with the call as a whole - the exception type it
    raised, or "malformed" - and is None when it answered normally.
    """

    operation: str
    backend: Backend
    entries: int
    seconds: float
    outcomes: tuple[str, ...]
    error: str | None = None


class Observer:
    """Callbacks; every one does nothing until overridden."""

    def on_call(self, event: CallEvent) -> None:
        """A backend call finished (see ``CallEvent``)."""

    def on_extended(self, lease: LeaseRecord, headroom: float) -> None:
        """An extend of ``lease`` succeeded with ``headroom`` seconds of its old
        deadline left when the answer came (negative: after the deadline)."""

    def on_lapse(self, lease: LeaseRecord, late: float) -> None:
        """``lease``'s deadline passed ``late`` seconds before an extend (or the
        handler's own delete or release) was sent."""

    def on_ended(self, lease: LeaseRecord, state: LeaseState, reason: str) -> None:
        """``lease`` ended: completed, released, lost or abandoned, for ``reason``."""

    def on_rolling(self, lease: LeaseRecord) -> None:
        """``lease``'s handler was told to roll over (``lease.rolling`` set): the
        service's cap on its message's invisibility is near (``on_cap="rollover"``)."""
