"""``OwnDeletes``: the worker deletes a message itself while the renewer process
still holds its lease back.

The renewer process holds a new lease back until its first renewal nears
(``renewers._held``): until then it has never been renewed, its receipt is the one
the worker received, and nothing there uses it. A job that ends before that -
most jobs - needs nothing from the renewer but to forget the lease. So the worker
sends a ``Drop`` (no reply) and reads its clock again: if the lease's time to be
adopted (``engine.owner_hold_until``, worked out from the config as the renewer's
engine works it out) still has not come, the renewer reads the drop before it
adopts the lease (its promoter reads what the worker wrote before it adopts one),
so the lease is never renewed and the message is the worker's to delete, in one
batch call per queue, as the thread renewer deletes it. No round trip, and none of
the renewer's CPU but reading two frames.

Anything but a timely "ok" - an error, a delete answered after the deadline, a
lease whose time came while the drop was on its way - is left to the renewer as a
``Complete``, which applies the lease rules to it as to any other lease (it keeps
the dropped ones a while for that).

A renewer that dies is replaced, and its leases taken over (``renewers._succession``):
the worker deletes a message itself only if the renewer its ``Drop`` went to is still
the current one, checked - and the lease marked ``deleting`` - under the lock the
takeover hands the leases over under. Otherwise the successor may hold the lease,
and the delete is its to do.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeGuard

from leasekeeper.backends.contract import Message
from leasekeeper.config import LeaseConfig
from leasekeeper.engine import Calls, delete_held, owner_hold_until
from leasekeeper.errors import LeaseLost
from leasekeeper.lease import Lease
from leasekeeper.record import LeaseState
from leasekeeper.renewers._frames import Drop
from leasekeeper.renewers._remote_lease import RemoteLease


class OwnDeletes:
    """The worker's own deletes of leases its renewer process holds back (see the
    module docstring). ``send`` writes a frame to the renewer and returns the link it
    went to (LeaseLost or OSError once there is none); ``current`` is the current
    renewer's link, read under ``lock``; ``calls`` makes the backend call and tells
    the observers."""

    def __init__(
        self,
        config: LeaseConfig,
        calls: Calls,
        now: Callable[[], float],
        send: Callable[[tuple[Any, ...]], object],
        *,
        lock: threading.Lock | None = None,
        current: Callable[[], object] = lambda: None,
    ) -> None:
        self._config = config
        self._calls = calls
        self._now = now
        self._send = send
        self._lock = lock if lock is not None else threading.Lock()
        self._current = current

    def until(self, message: Message, now: float, shared: bool) -> float:
        """Until when the worker may take a new lease on ``message`` back: the time
        the renewer adopts it; minus infinity when that has passed already, or when
        the renewer does not hold it back (``shared``: a watch lease, or one whose
        message has another lease here)."""
        until = -math.inf if shared else owner_hold_until(message, self._config)
        return until if now < until else -math.inf

    def complete_one(self, lease: Lease) -> TypeGuard[RemoteLease]:
        """``complete`` of one active lease: True once its message was deleted here
        in time (``complete``, for one lease, without its lists)."""
        now = self._now
        if not isinstance(lease, RemoteLease) or lease.state is not LeaseState.ACTIVE:
            return False
        until = lease.own_until
        if not now() < until or lease.deleting:
            return False
        try:
            sent_on = self._send(Drop([lease.key]))
        except (LeaseLost, OSError):
            return False
        lease.dropped = True
        with self._lock:
            # The renewer may have adopted it (or another taken it over): it decides.
            if not now() < until or self._current() is not sent_on:
                return False
            lease.deleting = True
        lease.own_until = -math.inf
        # (A call that raised comes back as "retry" outcomes: ``engine.delete_held``'s
        # call, for one lease, without its lists.)
        (outcome,) = self._calls.call(lease.message.backend, "delete", [lease.handle()], 0.0)
        if outcome.kind == "ok" and now() < lease.visible_until:
            return True
        lease.deleting = False
        return False

    def complete(self, leases: Sequence[RemoteLease]) -> list[RemoteLease]:
        """Delete the messages of the leases among ``leases`` that are the worker's
        (``claim``): those deleted in time; the others are the renewer's to complete."""
        claimed = self.claim(leases)
        return self.delete(claimed)[0] if claimed else claimed

    def claim(self, leases: Sequence[RemoteLease]) -> list[RemoteLease]:
        """The leases among ``leases`` that are the worker's to delete now (each
        marked ``deleting``); the renewer was told (``Drop``) and never renews them.
        The others are the renewer's to complete."""
        now = self._now()
        mine = [lease for lease in leases if now < lease.own_until and not lease.deleting]
        if not mine:
            return mine
        try:
            sent_on = self._send(Drop([lease.key for lease in mine]))
        except (LeaseLost, OSError):
            return []  # no renewer: the renewer's to complete (it says what happened)
        for lease in mine:
            lease.dropped = True
        with self._lock:
            if self._current() is not sent_on:
                return []  # another renewer took over meanwhile: it may hold them
            # Only what is still in time now is certain to be read before its adoption:
            # the drop was written before this clock reading.
            now = self._now()
            mine = [lease for lease in mine if now < lease.own_until]
            for lease in mine:
                lease.deleting = True
        for lease in mine:
            lease.own_until = -math.inf
        return mine

    def delete(self, leases: list[RemoteLease]) -> tuple[list[RemoteLease], list[RemoteLease]]:
        """Delete the claimed ``leases``' messages (``engine.delete_held``: one batch
        call per queue and ``max_batch``). Returns those deleted in time, and the
        others (the renewer's to complete: it applies the lease rules)."""
        deleted, answered = delete_held(self._calls, leases, self._now)
        others = [lease for lease, _ in answered]
        for lease in others:
            lease.deleting = False
        return deleted, others
