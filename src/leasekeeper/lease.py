"""Lease and LeaseState: leasekeeper's record of one in-flight message.

A lease is created by ``LeaseManager.register`` and ends in exactly one of four
states. Its operations (extend, delete, release) never overlap: each holds the
lease's ``_op_lock``, so a delete that arrives while an extend is in flight waits
for it and then uses the receipt that extend returned.
"""

from __future__ import annotations

import enum
import threading
from typing import TYPE_CHECKING

from leasekeeper.backends.base import Handle, Message
from leasekeeper.errors import LeaseLost

if TYPE_CHECKING:
    from leasekeeper.manager import LeaseManager


class LeaseState(str, enum.Enum):
    ACTIVE = "active"  # being renewed
    COMPLETED = "completed"  # deleted: the handler succeeded
    RELEASED = "released"  # made visible again (handler failed, or close())
    LOST = "lost"  # the service says the receipt is dead: someone else may have it
    ABANDONED = "abandoned"  # renewing stopped: max_lease_duration or the service's cap

    def __str__(self) -> str:
        return self.value


# Creating a threading.Event costs more memory than the rest of a lease (a Condition,
# a Lock and a deque), and most leases never have theirs read. So ``Lease.lost`` is
# created on first use; this lock makes "create it, and set it if the lease already
# ended" atomic with respect to the manager setting it.
_EVENT_LOCK = threading.Lock()

_NOT_OURS = (LeaseState.LOST, LeaseState.ABANDONED)
_new_tuple = tuple.__new__


class Lease:
    """One message's lease. Obtain it from ``LeaseManager.register`` or ``lease(msg)``."""

    __slots__ = (
        "__weakref__",
        "_due",
        "_event",
        "_gen",
        "_last_error",
        "_manager",
        "_op_lock",
        "_receipt",
        "_retries",
        "_signalled",
        "_state",
        "_watch",
        "extensions",
        "message",
        "reason",
        "registered_at",
        "visible_until",
    )

    def __init__(self, message: Message, manager: LeaseManager, registered_at: float) -> None:
        self.message = message
        self._manager = manager
        self._receipt = message.receipt
        self.visible_until = message.visible_until
        self.registered_at = registered_at
        self._state = LeaseState.ACTIVE
        self.extensions = 0
        self.reason: str | None = None
        self._event: threading.Event | None = None
        # Set when the handler must stop: the lease was lost or abandoned, or close()
        # released it under the handler's feet.
        self._signalled = False
        self._op_lock = threading.Lock()  # guards: one backend operation at a time
        self._gen = 0  # heap entry generation; 0 = not scheduled
        self._watch = 0  # deadline-watch entry while an extend call is out; 0 = none
        self._due = 0.0
        self._retries = 0
        self._last_error = ""  # the detail of the latest transient extend failure

    @property
    def id(self) -> str:
        return self.message.id

    @property
    def state(self) -> LeaseState:
        return self._state

    @property
    def lost(self) -> threading.Event:
        """Set when the handler no longer owns the message and should stop.

        That is: the lease was lost, abandoned, or released by ``close()``.
        """
        with _EVENT_LOCK:
            if self._event is None:
                self._event = threading.Event()
                if self._signalled:
                    self._event.set()
            return self._event

    def _signal(self) -> None:
        """Mark the lease as no longer ours and wake anyone waiting on ``lost``."""
        with _EVENT_LOCK:
            self._signalled = True
            event = self._event
        if event is not None:
            event.set()

    @property
    def is_lost(self) -> bool:
        """True when ``lost`` is set (without creating the event)."""
        return self._signalled

    def check(self) -> None:
        """Raise ``LeaseLost`` if the handler no longer owns the message.

        Call it between steps of a long job, before doing anything irreversible.
        """
        if self._signalled:
            raise LeaseLost(self.message.id, self.reason or str(self._state))

    def complete(self) -> None:
        """Delete the message: processing succeeded. A second call does nothing.

        Raises ``LeaseLost`` if the lease was lost (nothing is deleted), and
        ``LeaseError`` if it was released.
        """
        self._manager._complete(self)

    def release(self, delay: float | None = None) -> None:
        """Make the message visible again after ``delay`` seconds (default: the
        manager's ``release_delay``, grown by ``release_backoff`` per receive).

        Releasing a lease that already ended does nothing.
        """
        self._manager._release(self, delay)

    def visible_for(self) -> float:
        """Seconds the message is still known to stay invisible (0 when past)."""
        return max(0.0, self.visible_until - self._manager.clock.now())

    def _handle(self) -> Handle:
        # tuple.__new__ skips NamedTuple's Python-level __new__: this is on the
        # register/complete hot path.
        return _new_tuple(Handle, (self.message.id, self._receipt))

    def __repr__(self) -> str:
        return (
            f"<Lease id={self.message.id!r} state={self._state.value} "
            f"extensions={self.extensions} visible_for={self.visible_for():.1f}s>"
        )
