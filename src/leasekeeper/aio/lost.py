"""LostRelay: tells event loops that a lease ended under its handler, without a thread.

A lease's ``lost`` is a ``threading.Event``, set on a leasekeeper thread; nothing
can await it without a thread blocked in ``wait()`` (one per lease) or polling.
Instead, one ``LostRelay`` per manager is an ``Observer`` of it: the manager tells
its observers of every lease that ends, on its own threads, and the relay hands the
news to the event loop of whoever watches that lease
(``loop.call_soon_threadsafe``). Only watched leases cost anything - a dict entry
from ``watch`` to ``unwatch``, or to the lease's end - so a lease nobody waits on
costs one dict lookup when it ends.

An observer hears of every ending, including releases by ``close()`` or
``revoke()`` that set ``lease.lost`` but are not losses (``on_lost`` hears only of
losses). Observing makes the manager time its backend calls, which costs a few
microseconds a call; with ``renewer="process"`` it also has the renewer send its
events over.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

from leasekeeper.lease import Lease, LeaseState
from leasekeeper.manager import LeaseManager
from leasekeeper.observers import Observer

__all__ = ["LostRelay", "relay_for"]

Notify = Callable[[], object]


class LostRelay(Observer):
    """Calls each watcher of a lease once when the lease ends (see the module docstring).

    A watcher is called on whatever thread the lease ended on, or at once on the
    watching thread if the lease had already ended with ``lost`` set; it must be
    quick and thread-safe (``loop.call_soon_threadsafe`` is both), and may be
    called for an ending that is not a loss: it decides from ``lease.is_lost``
    and ``lease.state`` what the ending means.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _watches
        self._watches: dict[object, list[Notify]] = {}

    def watch(self, lease: Lease, notify: Notify) -> None:
        """Call ``notify()`` when ``lease`` ends (at once if it has ended lost)."""
        with self._lock:
            self._watches.setdefault(lease, []).append(notify)
        if lease.is_lost:  # it ended before the watch began: on_ended has been and gone
            self._tell(lease)

    def unwatch(self, lease: Lease, notify: Notify) -> None:
        """Stop watching (nothing if ``notify`` was told, or never watched)."""
        with self._lock:
            watchers = self._watches.get(lease)
            if watchers is None:
                return
            try:
                watchers.remove(notify)
            except ValueError:
                return
            if not watchers:
                del self._watches[lease]

    def watched(self) -> int:
        """How many leases are watched now (for tests of the relay's memory)."""
        with self._lock:
            return len(self._watches)

    def on_ended(self, lease: object, state: LeaseState, reason: str) -> None:
        self._tell(lease)

    def _tell(self, lease: object) -> None:
        with self._lock:
            watchers = self._watches.pop(lease, None)
        if watchers is not None:
            for notify in watchers:
                notify()


_relays_lock = threading.Lock()  # guards _relays
_relays: weakref.WeakKeyDictionary[LeaseManager, LostRelay] = weakref.WeakKeyDictionary()


def relay_for(manager: LeaseManager) -> LostRelay:
    """The relay of ``manager``, added as its observer on first use."""
    with _relays_lock:
        relay = _relays.get(manager)
        if relay is None:
            relay = LostRelay()
            manager.add_observer(relay)
            _relays[manager] = relay
        return relay
