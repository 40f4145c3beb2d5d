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


class HeldLeases:
    """The leases held back, by the worker's key; see the module docstring."""

    def __init__(self, renewer: ThreadRenewer, refused: Refused) -> None:
        self._renewer = renewer
        self._refused = refused
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

    def hold(self, key: int, queue: int, message: Message) -> Lease | None:
        """Hold a new lease on ``message``; None when it is to be registered at once
        (``ThreadRenewer.hold`` says why; or a lease on the message is held here:
        that one is adopted first, so the engine sees them in order and supersedes
        the older)."""
        ident = (queue, message.id)
        with self._lock:
            other = self._keys.get(ident)
            if other is not None:
                self._adopt_locked(other)
                return None
            if self._closed:
                return None
            held = self._renewer.hold(message)
            if held is None:
                return None
            lease, until = held
            self._held[key] = (lease, ident)
            self._keys[ident] = key
            heapq.heappush(self._due, (until, key))
            if until < self._waiting_until:
                self._wake_promoter()
        return lease

    def take(self, keys: Iterable[int]) -> list[Lease]:
        """The held leases among ``keys``, held no longer: the caller completes them
        (``complete_held``)."""
        held = self._held
        taken: list[Lease] = []
        if not held:
            return taken
        with self._lock:
            for key in keys:
                entry = held.pop(key, None)
                if entry is not None:
                    del self._keys[entry[1]]
                    taken.append(entry[0])
        return taken

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
        """Adopt each lease still held when its time comes; sleep until the next."""
        now = self._renewer.clock.now
        due, held = self._due, self._held
        with self._lock:
            while not self._closed:
                at = now()
                while due and (due[0][1] not in held or due[0][0] <= at):
                    _, key = heapq.heappop(due)
                    if key in held:
                        self._adopt_locked(key)
                self._waiting_until = due[0][0] if due else math.inf
                self._wake.wait(None if not due else max(0.0, due[0][0] - at))
