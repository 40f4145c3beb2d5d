"""azure-servicebus's real ``AutoLockRenewer``, driven without a network.

The renewer (``azure/servicebus/_common/auto_lock_renewer.py``) needs only this
of what it renews: ``isinstance(renewable, ServiceBusReceivedMessage)``,
``locked_until_utc``, ``_settled``, ``_lock_expired``, ``_received_timestamp_utc``,
``auto_renew_error`` and ``_receiver._running``; and of the receiver only
``renew_message_lock(message)``. ``StubReceivedMessage`` subclasses the SDK's
message class without running its AMQP constructor and sets exactly those
fields; ``StubReceiver.renew_message_lock`` forwards one call per message to a
leasekeeper Backend (the same ``LatencyBackend`` every design uses), and
``complete_message`` deletes and settles. So the renewer's own code - its
dispatcher thread that drains a task queue every 0.5 s, the re-queued task per
message, its fixed 10 s renew period, its thread pool - runs unchanged.

How it schedules: every registered message is a task that a pool thread runs:
"if locked_until - now <= renew_period: renew", then the task is put back on the
queue, and the dispatcher hands the queue to the pool again after sleeping 0.5 s.
Every message is therefore re-examined about twice a second, due or not.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

from azure.servicebus import AutoLockRenewer, ServiceBusReceivedMessage

from leasekeeper.backends.base import Backend, Message

RENEW_PERIOD = 10.0  # AutoLockRenewer._renew_period: renew when <= 10 s of lock remain


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def effective_renew_period(lock_duration: float) -> float:
    """The renew period the renewer uses for a lock of ``lock_duration`` seconds.

    Mirrors ``AutoLockRenewer.register``: locks of at most 10.5 s get
    ``timedelta.seconds * 0.75`` (whole seconds left at registration).
    """
    if lock_duration <= RENEW_PERIOD + 0.5:
        whole = int(lock_duration - 1e-3)
        return whole * 0.75
    return RENEW_PERIOD


class StubReceiver:
    """What AutoLockRenewer uses of a ``ServiceBusReceiver``."""

    def __init__(self, backend: Backend, lock_duration: float) -> None:
        self.backend = backend
        self.lock_duration = lock_duration
        self._running = True
        self.session = None
        self.renewals = 0

    def renew_message_lock(self, message: StubReceivedMessage, **_: Any) -> datetime.datetime:
        sent = utc_now()
        outcome = self.backend.extend([message.lk_message.handle], self.lock_duration)[0]
        if outcome.kind != "ok":
            raise RuntimeError(f"renew_message_lock failed: {outcome.kind} {outcome.detail}")
        self.renewals += 1
        expiry = sent + datetime.timedelta(seconds=self.lock_duration)
        message._expiry = expiry
        return expiry

    def complete_message(self, message: StubReceivedMessage) -> None:
        self.backend.delete([message.lk_message.handle])
        message._settled = True


class StubReceivedMessage(ServiceBusReceivedMessage):
    """A ``ServiceBusReceivedMessage`` standing for a leasekeeper ``Message``."""

    def __init__(self, message: Message, receiver: StubReceiver) -> None:
        # Deliberately not calling the SDK constructor: it needs an AMQP frame.
        self.lk_message = message
        self._settled = False
        self._receiver = receiver  # type: ignore[assignment]
        now = utc_now()
        self._received_timestamp_utc = now
        self.auto_renew_error = None
        left = message.visible_until - time.monotonic()
        self._expiry = now + datetime.timedelta(seconds=left)

    def __repr__(self) -> str:
        return f"StubReceivedMessage({self.lk_message.id!r})"


class AutoLockTracker:
    """Register messages with one AutoLockRenewer; complete them through the receiver."""

    def __init__(self, backend: Backend, *, lock_duration: float, max_workers: int = 32) -> None:
        self.receiver = StubReceiver(backend, lock_duration)
        self.renewer = AutoLockRenewer(
            max_lock_renewal_duration=7 * 24 * 3600.0, max_workers=max_workers
        )

    def prepare(self, message: Message) -> StubReceivedMessage:
        """What the SDK's receive would have returned for ``message`` (not timed)."""
        return StubReceivedMessage(message, self.receiver)

    def track(self, message: StubReceivedMessage) -> StubReceivedMessage:
        self.renewer.register(self.receiver, message)  # type: ignore[arg-type]
        return message

    def untrack(self, message: StubReceivedMessage) -> None:
        self.receiver.complete_message(message)

    def close(self) -> None:
        self.receiver._running = False
        self.renewer.close(wait=True)
