"""Rule 4: one operation at a time per lease (extend, delete, release, forget).

Each lease has a ``busy`` flag instead of a lock of its own: a lock object per lease
cost 88 bytes of the ~450 a lease took in flight, and a lease is busy for a few
milliseconds of its life. The flags are guarded by the renewal engine's registry
lock, the one lock the engine already takes on every register and every end, so the
register/complete hot path takes no more locks than it did with a lock per lease.

``OpGate`` sets and clears the flags. Whoever must wait - a handler's delete
behind an extend that is out, close() behind a handler's delete - waits on one
condition of that same lock, woken whenever a flag is cleared while someone waits.
Taking a whole batch happens at once or not at all (``take_all``), so two batch
callers whose leases overlap can never deadlock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from leasekeeper.record import LeaseRecord


class OpGate:
    """The ``busy`` flags of one engine's leases (see the module docstring).

    ``lock`` is the engine's registry lock; ``now`` its clock's ``now`` (for timed
    waits). The ``*_locked`` methods expect the caller to hold ``lock``.
    """

    __slots__ = ("_freed", "_lock", "_now", "waiting")

    def __init__(self, lock: threading.Lock, now: Callable[[], float]) -> None:
        self._lock = lock
        self._freed = threading.Condition(lock)  # notified when a flag is cleared
        #: Threads waiting for a lease to be given back (guarded by the lock): a giver
        #: notifies only when someone waits.
        self.waiting = 0
        self._now = now

    def try_take(self, records: Sequence[LeaseRecord]) -> list[LeaseRecord]:
        """Mark busy those of ``records`` that are free; return them (never waits)."""
        with self._lock:
            return self.try_take_locked(records)

    def try_take_locked(self, records: Sequence[LeaseRecord]) -> list[LeaseRecord]:
        taken = []
        for record in records:
            if not record.busy:
                record.busy = True
                taken.append(record)
        return taken

    def take(self, record: LeaseRecord, timeout: float | None = None) -> bool:
        """Wait until ``record`` is free (up to ``timeout`` seconds) and mark it busy.
        Returns False if the timeout passed first."""
        with self._lock:
            return self.take_locked(record, timeout)

    def take_locked(self, record: LeaseRecord, timeout: float | None = None) -> bool:
        if not record.busy:
            record.busy = True
            return True
        deadline = None if timeout is None else self._now() + timeout
        self.waiting += 1
        try:
            while record.busy:
                left = None if deadline is None else deadline - self._now()
                if left is not None and left <= 0:
                    return False
                self._freed.wait(left)
        finally:
            self.waiting -= 1
        record.busy = True
        return True

    def take_all(self, records: Sequence[LeaseRecord]) -> None:
        """Wait until every one of ``records`` is free, then mark them all busy at once."""
        with self._lock:
            self.waiting += 1
            try:
                while any(record.busy for record in records):
                    self._freed.wait()
            finally:
                self.waiting -= 1
            for record in records:
                record.busy = True

    def give(self, record: LeaseRecord) -> None:
        with self._lock:
            self.give_locked(record)

    def give_locked(self, record: LeaseRecord) -> None:
        record.busy = False
        if self.waiting:
            self._freed.notify_all()

    def notify_locked(self) -> None:
        """Wake the waiters after a flag was cleared inline (the hot path's give)."""
        self._freed.notify_all()

    def give_all(self, records: Sequence[LeaseRecord]) -> None:
        with self._lock:
            for record in records:
                record.busy = False
            if self.waiting:
                self._freed.notify_all()
