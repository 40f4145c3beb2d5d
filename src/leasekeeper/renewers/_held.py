"""``HeldLeases``: the renewer process's leases held back until their first renewal.

Most jobs end long before their lease's first renewal would fall due. A lease the
renewer process holds back (``ThreadRenewer.hold``: made and counted, not
scheduled) costs, when its job ends first, only its share of one batch delete
(``ThreadRenewer.complete_held``); none of the schedule's bookkeeping. One promoter
thread hands each lease still held to the engine (``ThreadRenewer.adopt``) a timer
tick before its first renewal could fall due; and any request other than a
complete (release, forget, abandon), a second lease on the same message, close()
and the worker's death hand them over at once, so the engine alone applies the
lease rules to everything but the plain early delete.

The worker may delete a held lease's message itself (``drop``): it says so while,
by its clock, the lease's time to be adopted has not come, and the promoter reads
what the worker wrote (``sync``) after that time and before it adopts: a lease the
worker deletes is never renewed, so its receipt is never changed under the
worker's delete. A ``Complete`` of one the worker could not delete after all
brings the lease's fields again: it is held anew, then completed.
"""

from __future__ import annotations

import heapq
import logging
import math
import threading
from collections.abc import Callable, Iterable

from leasekeeper.backends.contract import Message
from leasekeeper.errors import LeaseError
from leasekeeper.lease import Lease
from leasekeeper.renewers.thread import ThreadRenewer

log = logging.getLogger("leasekeeper.renewer")

#: Told of a held lease the engine refused to adopt (it was closed): key, lease, why.
Refused = Callable[[int, Lease, LeaseError], None]
#: Reads and does what the worker wrote so far, before leases are adopted; returns
#: what is left to do once they are (the requests among it).
Sync = Callable[[], Callable[[], None]]


def _in_sync() -> Callable[[], None]:
    return _nothing


def _nothing() -> None:
    pass


class HeldLeases:
    """The leases held back, by the worker's key; see the module docstring."""

    def __init__(self, renewer: ThreadRenewer, refused: Refused, sync: Sync = _in_sync) -> None:
        self._renewer = renewer
        self._refused = refused
        self._sync = sync
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._held: dict[int, tuple[Lease, tuple[int, str]]] = {}  # key -> lease, its message
        self._keys: dict[tuple[int, str], int] = {}  # (queue, message id) -> key
        # (adopt by, key), earliest first; entries of leases no longer held are stale
        # and dropped when they reach the top.
        self._due: list[tuple[float, int]] = []
        self._waiting_until = math.inf  # when the promoter wakes next
        self._closed = False  # no more holding: everything was adopted
        self._promoter: threading.Thread | None = None

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, key: int, queue: int, message: Message, own: bool = False) -> Lease | None:
        """Hold a new lease on ``message``; None when it is to be registered at once
        (``ThreadRenewer.hold`` says why; or a lease on the message is held here:
        that one is adopted first, so the engine sees them in order and supersedes
        the older). ``own``: the worker may ``drop`` it; held even when late."""
        ident = (queue, message.id)
        with self._lock:
            other = self._keys.get(ident)
            if other is not None:
                self._adopt_locked(other)
                return None
            if self._closed:
                return None
            held = self._renewer.hold(message, late=own)
            if held is None:
                return None
            lease, until = held
            self._held[key] = (lease, ident)
            self._keys[ident] = key
            heapq.heappush(self._due, (until, key))
            if until < self._waiting_until:
                self._wake_promoter()
        return lease

    def take(self, keys: Iterable[int]) -> dict[int, Lease]:
        """The held leases among ``keys``, by key, held no longer: the caller
        completes them (``complete_held``)."""
        held = self._held
        taken: dict[int, Lease] = {}
        if not held:
            return taken
        with self._lock:
            for key in keys:
                entry = held.pop(key, None)
                if entry is not None:
                    del self._keys[entry[1]]
                    taken[key] = entry[0]
        return taken

    def drop(self, keys: Iterable[int]) -> list[tuple[int, Lease]]:
        """The worker deletes these held leases' messages itself: held no longer, never
        adopted. Returns them; keys not held are left as they are."""
        dropped: list[tuple[int, Lease]] = []
        with self._lock:
            for key in keys:
                entry = self._held.pop(key, None)
                if entry is not None:
                    del self._keys[entry[1]]
                    dropped.append((key, entry[0]))
        return dropped

    def adopt(self, keys: Iterable[int]) -> None:
        """Hand the held leases among ``keys`` to the engine (before another
        request concerns them)."""
        if not self._held:
            return
        with self._lock:
            for key in keys:
                if key in self._held:
                    self._adopt_locked(key)

    def adopt_all(self) -> None:
        """Hand every held lease to the engine and hold no more (close(), or the
        worker's death: the engine then releases them with the others)."""
        with self._lock:
            self._closed = True
            for key in list(self._held):
                self._adopt_locked(key)
            self._wake.notify()

    def _adopt_locked(self, key: int) -> None:
        lease, ident = self._held.pop(key)
        del self._keys[ident]
        try:
            self._renewer.adopt(lease)
        except LeaseError as exc:
            self._refused(key, lease, exc)

    def _wake_promoter(self) -> None:
        if self._promoter is None:
            self._promoter = threading.Thread(
                target=self._promote, name="leasekeeper-renewer-promoter", daemon=True
            )
            self._promoter.start()
        else:
            self._wake.notify()

    def _promote(self) -> None:
        """Adopt each lease still held when its time comes; sleep until the next.
        What the worker wrote before that time is read first (``sync``): a ``drop``
        it sent in time is never adopted."""
        now = self._renewer.clock.now
        due, held = self._due, self._held
        with self._lock:
            while not self._closed:
                at = now()
                while due and due[0][1] not in held:
                    heapq.heappop(due)  # a lease no longer held
                after = _nothing
                if due and due[0][0] <= at:
                    self._lock.release()
                    try:
                        after = self._sync()
                    finally:
                        self._lock.acquire()
                    while due and (due[0][1] not in held or due[0][0] <= at):
                        _, key = heapq.heappop(due)
                        if key in held:
                            self._adopt_locked(key)
                if after is not _nothing:
                    self._lock.release()
                    try:
                        after()
                    finally:
                        self._lock.acquire()
                    continue
                self._waiting_until = due[0][0] if due else math.inf
                self._wake.wait(None if not due else max(0.0, due[0][0] - at))
