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

import json
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from leasekeeper.backends.contract import Message
from leasekeeper.clock import Clock
from leasekeeper.errors import BackendError, LeaseError, LeaseLost
from leasekeeper.reasons import LostReason
from leasekeeper.record import LeaseRecord, LeaseState
from leasekeeper.rollover import (
    Lineage,
    Rollover,
    carried,
    checkpoint_text,
    next_hop,
    send_continuation,
    unwrap,
)

if TYPE_CHECKING:
    from types import TracebackType

__all__ = [
    "Lease",
    "LeaseOwner",
    "LeaseScope",
    "LeaseState",
    "OnLost",
    "WatchLease",
    "settle_rollover",
]

log = logging.getLogger("leasekeeper.manager")


class LeaseOwner(Protocol):
    """Everything a lease asks of its owner: the renewer that registered it
    (``leasekeeper.renewers.protocol.Renewer`` extends this protocol)."""

    @property
    def clock(self) -> Clock: ...

    def complete(self, lease: Lease) -> None: ...

    def release(self, lease: Lease, delay: float | None) -> None: ...

    def abandon(self, lease: Lease, reason: str) -> None: ...

    def forget(self, lease: Lease) -> None: ...

    def fail(self, lease: Lease, error: BaseException | None, delay: float | None) -> None:
        """The handler failed: release the message, or dead-letter a poison one."""
        ...

    def progress(self, lease: Lease) -> None:
        """The handler made progress (``stall_timeout``)."""
        ...

    def rolled_over(self, lease: Lease) -> None:
        """Count a rollover: the continuation was sent and the original deleted."""
        ...


class Lease(LeaseRecord):
    """One message's lease. Obtain it from ``LeaseManager.register`` or ``lease(msg)``.

    Public API: ``message``, ``id``, ``state``, ``lost``, ``is_lost``, ``check()``,
    ``complete()``, ``release(delay)``, ``forget()``, ``extensions``,
    ``receive_count``, ``visible_until``, ``visible_for()``, ``registered_at``,
    ``reason``; for long jobs ``progress()``, ``checkpoint(state)``, ``rolling``,
    ``resumed`` and ``lineage`` (docs/outliving.md). The other attributes are the
    renewal engine's bookkeeping (see ``LeaseRecord``).

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
        """Raise ``LeaseLost`` if the handler no longer owns the message, and
        ``Rollover`` once it is to hand the job on (``rolling`` is set).

        Call it between steps of a long job, before doing anything irreversible.
        """
        if self.signalled:
            raise LeaseLost(self.message.id, self.reason or str(self.state), self.lost_reason)
        if self.is_rolling:
            raise Rollover(f"message {self.message.id!r} nears the service's cap: roll over")

    # ------------------------------------------------------------------ long jobs

    def progress(self) -> None:
        """Say the handler is making progress. With ``stall_timeout``, a lease whose
        handler has not said so for that long is let go (lost, ``stalled``)."""
        self.owner.progress(self)

    def checkpoint(self, state: object) -> None:
        """Save ``state`` (JSON-serialisable) as the job's progress: a rollover
        carries the latest to the next hop, where it is ``lease.resumed``. Counts as
        ``progress()``. ``TypeError``/``ValueError`` when ``state`` is not JSON."""
        self.roll_state().checkpoint = checkpoint_text(state)
        self.owner.progress(self)

    @property
    def rolling(self) -> threading.Event:
        """Set when the job is to roll over: the service's cap on the message's
        invisibility is near (``on_cap="rollover"``). Raise ``Rollover`` then."""
        return self.rolling_event()

    @property
    def resumed(self) -> object:
        """The checkpoint this message carries as a continuation (what the previous
        hop saved last with ``checkpoint``); None on an original."""
        found = carried(self.message)
        return None if found is None or found.checkpoint is None else json.loads(found.checkpoint)

    @property
    def lineage(self) -> Lineage:
        """``(first_id, hop)``: the id of the message the job started as, and this
        message's hop (0 on that original)."""
        found = carried(self.message)
        return Lineage(self.message.id, 0) if found is None else Lineage(found.first_id, found.hop)

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
    ) -> bool:
        if exc_type is not None and issubclass(exc_type, Rollover):
            settle_rollover(self)
            return True  # handed on: the block's job is done
        settle(self, exc, None)
        return False

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
    stalls = False  # its owner, not a handler of ours, does the work

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


def settle_rollover(lease: Lease) -> str:
    """End a block that raised ``Rollover``: send the continuation (the same body, the
    lineage one hop on, the latest checkpoint), then delete the original, and count
    it. Returns the continuation's id.

    Nothing is sent for a lease that is lost (``LeaseLost``: another consumer may
    have the message). When the send fails the original is released, to be done
    again from the checkpoint it carries, and the send's error raised. When the
    delete fails after the send, both messages exist: the error is raised and the
    original comes back (a handler tells it by its lineage; docs/outliving.md).
    """
    state = lease.state
    if state is not LeaseState.ACTIVE and state is not LeaseState.ABANDONED:
        raise LeaseLost(lease.id, lease.reason or f"{state}: not rolled over", lease.lost_reason)
    if not lease.visible_for() > 0:
        # Its deadline passed (as known here): the message may be another's now, so
        # no continuation. Released rather than left renewed where the renewer knows
        # better (a renewer process whose last notices a held GIL delayed).
        release_quietly(lease)
        raise LeaseLost(lease.id, "its deadline passed before the rollover: not rolled over")
    roll = lease.roll
    lineage = next_hop(lease.message, None if roll is None else roll.checkpoint)
    try:
        sent = send_continuation(lease.message, lineage)
    except Exception:
        log.exception("rollover of message %r: its continuation was not sent", lease.id)
        release_quietly(lease)  # done again from where it stood: no failure of its own
        raise
    try:
        settle(lease, None, None)
    except Exception as exc:
        log.warning(
            "rollover of message %r: continuation %r sent, but the original was not "
            "deleted (%s); both may run - see lease.lineage",
            lease.id,
            sent,
            exc,
        )
        raise
    lease.owner.rolled_over(lease)
    log.info("message %r rolled over: continued as %r (hop %d)", lease.id, sent, lineage.hop)
    return sent


def release_quietly(lease: Lease) -> None:
    """Release ``lease`` (the grown delay) as a rollover that could not happen does:
    not a failure of the handler's, so never a dead letter; a loss was told already."""
    try:
        lease.release()
    except LeaseLost:
        pass
    except Exception:
        log.exception("release of message %r after a rollover that failed", lease.id)


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
        self._lease = self._register(unwrap(self._message))
        return self._lease

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        lease = self._lease
        assert lease is not None, "LeaseScope exited without entering"
        if exc_type is not None and issubclass(exc_type, Rollover):
            settle_rollover(lease)
            return True  # handed on: the block's job is done
        settle(lease, exc if exc_type is not None else None, self._delay)
        return False
