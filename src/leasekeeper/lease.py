"""Lease, WatchLease, LeaseState and LeaseScope: what a handler holds while it works.

A lease is created by ``LeaseManager.receive``/``register`` (or ``watch``) and ends
in exactly one of five states. Its operations (extend, delete, release, forget)
never overlap: each takes the lease for as long as its call is out, so a delete
that arrives while an extend is in flight waits for it and then uses the receipt
that extend returned (rule 4 in docs/design.md).

``Lease`` is a ``LeaseRecord`` (the renewal engine's view of the lease) plus the
handler's API. Its ``complete``/``release``/``forget`` go to its ``owner``: the
renewer that made it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from leasekeeper._record import LeaseRecord, LeaseState
from leasekeeper.backends.base import Message
from leasekeeper.clock import Clock
from leasekeeper.errors import BackendError, LeaseError, LeaseLost
from leasekeeper.reasons import LostReason

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["Lease", "LeaseOwner", "LeaseScope", "LeaseState", "OnLost", "WatchLease"]

log = logging.getLogger("leasekeeper.manager")


def not_a_message(value: object) -> TypeError:
    """The error for registering something that is not a leasekeeper ``Message``."""
    return TypeError(
        "register() takes a leasekeeper Message (from backend.receive() or "
        f"backend.adopt(raw)), got {type(value).__module__}.{type(value).__qualname__}"
    )


class LeaseOwner(Protocol):
    """Where a lease's own operations go (the manager's handler operations)."""

    @property
    def clock(self) -> Clock: ...

    def complete(self, lease: Lease) -> None: ...

    def release(self, lease: Lease, delay: float | None) -> None: ...

    def abandon(self, lease: Lease, reason: str) -> None: ...

    def forget(self, lease: Lease) -> None: ...

    def fail(self, lease: Lease, error: BaseException | None, delay: float | None) -> None:
        """The handler failed: release the message, or dead-letter a poison one."""
        ...


class Lease(LeaseRecord):
    """One message's lease. Obtain it from ``LeaseManager.register`` or ``lease(msg)``.

    Public API: ``message``, ``id``, ``state``, ``lost``, ``is_lost``, ``check()``,
    ``complete()``, ``release(delay)``, ``forget()``, ``extensions``,
    ``receive_count``, ``visible_until``, ``visible_for()``, ``registered_at``,
    ``reason``. The other attributes are the renewal engine's bookkeeping (see
    ``LeaseRecord``).

    A lease is also a context manager with ``with lease(msg)``'s semantics, for the
    leases ``LeaseManager.receive()`` returns: ``with held:`` completes the message
    when the block succeeds, releases it when the block raises, and raises
    ``LeaseLost`` (deleting nothing) when the lease was lost meanwhile.
    """

    __slots__ = ("__weakref__",)
    owner: LeaseOwner

    @property
    def id(self) -> str:
        return self.message.id

    @property
    def receive_count(self) -> int:
        """How many times the service has delivered this message, this time included
        (SQS ApproximateReceiveCount, MNS DequeueCount, Azure dequeue_count)."""
        return self.message.receive_count

    @property
    def lost(self) -> threading.Event:
        """Set when the handler no longer owns the message and should stop.

        That is: the lease was lost, abandoned, or released by ``close()``.
        """
        return self.stop_event()

    @property
    def is_lost(self) -> bool:
        """True when ``lost`` is set (without creating the event)."""
        return self.signalled

    def check(self) -> None:
        """Raise ``LeaseLost`` if the handler no longer owns the message.

        Call it between steps of a long job, before doing anything irreversible.
        """
        if self.signalled:
            raise LeaseLost(self.message.id, self.reason or str(self.state), self.lost_reason)

    def complete(self) -> None:
        """Delete the message: processing succeeded. A second call does nothing.

        Raises ``LeaseLost`` if the lease was lost - including when its deadline
        passed without a successful extend on a service whose receipts do not
        rotate (SQS): nothing is deleted then - and ``LeaseError`` if it was released.
        """
        self.owner.complete(self)

    def release(self, delay: float | None = None) -> None:
        """Make the message visible again after ``delay`` seconds (default: the
        manager's ``release_delay``, grown by ``release_backoff`` per receive).

        Releasing a lease that already ended does nothing; releasing one whose
        deadline passed unextended on a service whose receipts do not rotate ends
        it lost and raises ``LeaseLost``.
        """
        self.owner.release(self, delay)

    def forget(self) -> None:
        """Stop renewing, without deleting or releasing the message: whoever owns it
        (a framework that acks it itself) takes it from here. Returns once no extend
        of it is in flight, so a visibility change made after it is never overwritten
        by a late extend. The lease ends ``FORGOTTEN``; forgetting an ended lease
        does nothing."""
        self.owner.forget(self)

    def visible_for(self) -> float:
        """Seconds the message is still known to stay invisible (0 when past)."""
        return max(0.0, self.visible_until - self.owner.clock.now())

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        settle(self, exc, None)

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} id={self.message.id!r} state={self.state.value} "
            f"extensions={self.extensions} visible_for={self.visible_for():.1f}s>"
        )


class WatchLease(Lease):
    """A lease leasekeeper renews but never ends: ``LeaseManager.watch(message)``.

    The message belongs to someone else (a framework such as Celery or Dramatiq,
    which deletes or requeues it itself); leasekeeper keeps it invisible until that
    owner calls ``forget()``, and reports it like any lease if it is lost.
    ``complete()`` and ``release()`` raise ``LeaseError``; ``close()`` forgets
    watch leases, it never releases them.
    """

    __slots__ = ()

    def complete(self) -> None:
        raise LeaseError(
            f"lease on message {self.message.id!r} is a watch: its owner deletes the "
            "message and then calls forget()"
        )

    def release(self, delay: float | None = None) -> None:
        raise LeaseError(
            f"lease on message {self.message.id!r} is a watch: its owner requeues the "
            "message and then calls forget()"
        )

    def __enter__(self) -> Lease:
        raise LeaseError("a watch lease is not a scope: its owner ends the message")


def settle(lease: Lease, error: BaseException | None, delay: float | None) -> None:
    """End a leased block: complete on success; on an exception (which the caller
    re-raises) hand the failure to the lease's owner - released after ``delay`` or
    the grown delay, or dead-lettered when it is a poison message; ``LeaseLost`` when
    the lease was lost and nothing was deleted."""
    if error is None:
        try:
            lease.complete()
        except BackendError:
            # The handler succeeded but the delete keeps failing: stop renewing so
            # the message comes back and is done again, rather than hide it for ever.
            lease.owner.abandon(lease, "delete failed: left to lapse")
            raise
        return
    try:
        lease.owner.fail(lease, error, delay)
    except LeaseLost:
        pass  # already reported as lost; the handler's own exception matters more
    except Exception:
        # The handler's own exception matters more; the lease is left to
        # lapse, so the message still comes back.
        log.exception("release of message %r after a handler error failed", lease.id)


#: ``on_lost(lease, reason)``: told of every lease that is lost or abandoned, from a
#: leasekeeper thread, after the lease's ``lost`` event is set.
OnLost = Callable[[Lease, LostReason], object]


class LeaseScope:
    """``with manager.lease(msg) as lease:``: complete on success, release on error.

    On normal exit the message is deleted; if the lease was lost meanwhile,
    ``LeaseLost`` is raised instead and nothing is deleted. On an exception the
    message is released (after ``release_delay``) and the exception propagates.
    """

    __slots__ = ("_delay", "_lease", "_message", "_register")

    def __init__(
        self,
        register: Callable[[Message], Lease],
        message: Message,
        release_delay: float | None,
    ) -> None:
        self._register = register
        self._message = message
        self._delay = release_delay
        self._lease: Lease | None = None

    def __enter__(self) -> Lease:
        self._lease = self._register(self._message)
        return self._lease

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease = self._lease
        assert lease is not None, "LeaseScope exited without entering"
        settle(lease, exc if exc_type is not None else None, self._delay)
