"""Telling of ended leases: the handler's signal, ``on_lost``, the log line, observers.

A lease ends under the engine's registry lock, but whoever hears of it must not be
told there: ``on_lost`` may call back into the manager, and an observer may be slow.
So the engine queues each ending here (``queue_locked``) and ``drain`` tells them
once every lock is let go, on whichever leasekeeper thread gets there first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from leasekeeper.engine._calls import Calls
from leasekeeper.engine._transitions import OnLost, tell_lost
from leasekeeper.record import LeaseRecord, LeaseState


class Reporter:
    """The endings of one engine's leases still to be told (see the module docstring).

    ``on_error`` counts an ``on_lost`` callback that raised.
    """

    __slots__ = ("_calls", "_ended", "_on_error", "on_lost", "pending")

    def __init__(self, calls: Calls, on_lost: OnLost | None, on_error: Callable[[], None]) -> None:
        self._calls = calls
        self.on_lost = on_lost
        self._on_error = on_error
        #: Leases whose handler (and on_lost) must hear of their end (the engine
        #: checks it on its hot path: truthy when there is anything to drain).
        self.pending: deque[LeaseRecord] = deque()
        # Ended leases the observers have not heard of yet (only while there are any).
        self._ended: deque[tuple[LeaseRecord, LeaseState, str]] = deque()

    def queue_locked(self, record: LeaseRecord, state: LeaseState, *, signal: bool) -> None:
        """``record`` just ended in ``state`` (under the registry lock). ``signal``:
        its handler and ``on_lost`` must hear of it."""
        if self._calls.observers:
            ending = record.ending
            self._ended.append((record, state, "" if ending is None else ending.detail))
        if signal:
            self.pending.append(record)

    def has_pending(self) -> bool:
        return bool(self.pending)

    def drain(self) -> None:
        """Signal and report ended leases outside every lock (callbacks may re-enter)."""
        pending = self.pending
        while pending:  # checked first: the common case is nothing to report
            try:
                record = pending.popleft()
            except IndexError:  # another thread took the last one
                break
            self._notify(record)
        ended = self._ended
        while ended:
            try:
                event = ended.popleft()
            except IndexError:
                break
            self._calls.tell("on_ended", *event)

    def _notify(self, record: LeaseRecord) -> None:
        # The handler hears first (lease.lost), so it can stop as early as possible;
        # on_lost runs after, on this same leasekeeper thread.
        record.signal()
        if record.state is not LeaseState.RELEASED:
            tell_lost(record, self.on_lost, self._on_error)
