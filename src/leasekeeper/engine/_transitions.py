"""Lease-state transitions: the rules every renewer follows, in one place.

A lease is ``ACTIVE`` from ``register`` until it ends, once, in one of five states
(``record.LeaseState``). Both renewers - the renewal engine in this process
(``_engine``, ``_handler_ops``) and the worker's side of a renewer process
(``renewers.process``) - keep their own registries under their own locks, and ask
this module what a transition may do:

- registering: what is not a message, has no deadline or too little of it left, or
  comes to a closed renewer is refused (``not_a_message``, ``no_deadline``,
  ``admit``, ``closed_error``); a message already leased gets the same lease
  (``admit``, ``ended_lease``), and one received again with a new receipt
  supersedes the old lease (``SUPERSEDED``);
- ending a lease exactly once (``mark_ended``), and whose handler hears of it
  (``signals``);
- whether a lease may still be completed or released (``completable``,
  ``releasable``);
- the standard endings (``COMPLETED``, ``FORGOTTEN``, ...);
- telling ``on_lost`` of a loss, its log line, and counting a callback that raised
  in ``stats().callback_errors`` (``tell_lost``; observers are told through
  ``_calls.Calls.tell``, which counts the same way).

These are plain functions: ``admit`` and ``mark_ended`` sit on the register/complete
hot path (see ``make bench``).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from leasekeeper.backends.contract import Message
from leasekeeper.errors import LeaseError, LeaseLost, LeaseTooShort, ManagerClosed
from leasekeeper.reasons import Ending, LostReason
from leasekeeper.record import LeaseRecord, LeaseState

log = logging.getLogger("leasekeeper.manager")

R = TypeVar("R", bound=LeaseRecord)

_ACTIVE = LeaseState.ACTIVE
_COMPLETED = LeaseState.COMPLETED
_ABANDONED = LeaseState.ABANDONED
_LOST = LeaseState.LOST
_weakref = weakref.ref

COMPLETED = Ending(None, "completed")
FORGOTTEN = Ending(None, "forgotten: its owner took it back")
SUPERSEDED = Ending(LostReason.SUPERSEDED, "superseded: the message was received again")

#: ``on_lost(lease, reason)``: every record a renewer ends is its ``Lease``.
OnLost = Callable[[Any, LostReason], object]


# ---------------------------------------------------------------------- registering


def not_a_message(value: object) -> TypeError:
    """The error for registering something that is not a leasekeeper ``Message``."""
    return TypeError(
        "register() takes a leasekeeper Message (from backend.receive() or "
        f"backend.adopt(raw)), got {type(value).__module__}.{type(value).__qualname__}"
    )


def no_deadline(message: Message) -> ValueError:
    """The error for registering a message whose deadline is not a finite time."""
    return ValueError(
        f"message {message.id!r} has no finite deadline ({message.visible_until!r}): "
        "give it a finite visibility_timeout"
    )


def closed_error() -> ManagerClosed:
    """The error for registering with a renewer that was closed."""
    return ManagerClosed("this LeaseManager is closed; it takes no new leases")


def ended_lease(message: Message, owner: object) -> LeaseRecord | None:
    """The lease ``owner`` held on this very delivery of ``message`` if it ended:
    registering it again returns that lease, not a second one."""
    ref = message.ended_lease
    ended = None if ref is None else ref()
    return ended if isinstance(ended, LeaseRecord) and ended.owner is owner else None


def admit(existing: R | None, message: Message, now: float, minimal_life: float) -> R | None:
    """Whether ``message`` gets a new lease, ``existing`` being the active lease held
    on its id (under the registry lock of an open renewer). Returns ``existing`` when
    it is the lease of this very delivery (hand it back); None when a new lease is
    to be made - the caller then ends ``existing``, if any, ``SUPERSEDED``. Raises
    ``LeaseTooShort`` when less than ``minimal_life`` is left (nothing superseded)."""
    if existing is not None and (
        existing.message is message or existing.receipt == message.receipt
    ):
        return existing
    left = message.visible_until - now
    if left < minimal_life:
        raise LeaseTooShort(message.id, left, minimal_life)
    return None


# ---------------------------------------------------------------------- ending


def mark_ended(record: LeaseRecord, state: LeaseState, ending: Ending) -> bool:
    """End ``record`` in ``state`` (under the registry lock): False, changing nothing,
    when it ended already. Only an active lease ends - or an abandoned one whose
    delete still went through (its message was still hidden)."""
    current = record.state
    if current is not _ACTIVE and not (current is _ABANDONED and state is _COMPLETED):
        return False
    record.state = state
    record.ending = ending
    # register(message) of this very delivery returns this lease, not a second one.
    record.message.ended_lease = _weakref(record)
    return True


def signals(state: LeaseState, stop_handler: bool) -> bool:
    """Whether the handler of a lease that ended in ``state`` is told to stop (and
    ``on_lost`` told): lost and abandoned leases always, a released one when the
    release was not its handler's own doing (``stop_handler``: a shutdown)."""
    return state is _LOST or state is _ABANDONED or stop_handler


def lost_error(record: LeaseRecord, fallback: str) -> LeaseLost:
    """The ``LeaseLost`` a handler hears for an ended ``record``."""
    ending = record.ending
    if ending is None:
        return LeaseLost(record.message.id, fallback)
    return LeaseLost(record.message.id, ending.detail, ending.lost_reason)


def completable(record: LeaseRecord, now: float) -> bool:
    """Whether a delete of ``record`` may be sent: False when it is completed
    already; raises when it cannot be completed (released, forgotten, lost, or
    abandoned with its message visible again). An active lease may be - rule 5
    (``_lapse``) judges a lapsed one before its delete is sent."""
    state = record.state
    if state is _ACTIVE:
        return True
    if state is _COMPLETED:
        return False
    if state is LeaseState.RELEASED:
        if record.signalled:
            raise lost_error(record, "released")
        raise LeaseError(
            f"lease on message {record.message.id!r} was released ({record.reason}); "
            "it cannot be completed"
        )
    if state is LeaseState.FORGOTTEN:
        raise LeaseError(f"lease on message {record.message.id!r} was forgotten; its owner ends it")
    if state is _LOST or now >= record.visible_until:
        raise lost_error(record, str(state))
    return True  # abandoned, and its message still hidden


def releasable(record: LeaseRecord) -> bool:
    """Whether a release of ``record`` may be sent: False when it ended already (not
    ours to release); raises for a completed one."""
    state = record.state
    if state is _COMPLETED:
        raise LeaseError(f"lease on message {record.message.id!r} was completed; cannot release")
    return state is _ACTIVE


def released(delay: float | None, stop_handler: bool) -> Ending:
    """How a release that went through (after ``delay``, when known) ends its lease."""
    if stop_handler:
        return Ending(None, "released at shutdown")
    return Ending(None, "released" if delay is None else f"released (delay {delay:g}s)")


# ---------------------------------------------------------------------- reporting


def tell_lost(record: LeaseRecord, on_lost: OnLost | None, count_error: Callable[[], None]) -> None:
    """Tell of a lease that was lost or abandoned (its handler signalled already):
    one WARNING line, then ``on_lost(lease, reason)``; a callback that raises is
    logged and counted (``count_error``: ``stats().callback_errors``)."""
    reason = record.lost_reason or LostReason.LAPSED
    log.warning(
        "lease on message %r %s (%s): %s",
        record.message.id,
        record.state.value,
        reason.value,
        record.reason,
    )
    if on_lost is None:
        return
    try:
        on_lost(record, reason)
    except Exception:
        count_error()
        log.exception("on_lost callback raised for message %r", record.message.id)
