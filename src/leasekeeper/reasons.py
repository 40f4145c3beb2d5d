"""Why a lease ended: ``LostReason``, the one vocabulary of losses, and ``Ending``.

Every lease that is lost or abandoned carries one ``LostReason``. The same value
reaches ``on_lost(lease, reason)``, ``lease.lost_reason``, ``LeaseLost.lost_reason``,
the log line, ``stats().lost_reasons``, OpenTelemetry's ``leasekeeper.lease.reason``
attribute and Prometheus' ``reason`` label, so a dashboard, an alert and a handler
all speak of a loss in the same words. The free text beside it (``lease.reason``:
the service's error code, the last transient error, how late) is for people.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

__all__ = ["Ending", "LostReason"]


class LostReason(str, enum.Enum):
    """Why a lease was lost or abandoned. A ``str``: ``reason == "lapsed"`` works."""

    #: Renewed too late: its invisibility ran out before an extend (or the handler's
    #: delete) was sent or answered - a starved scheduler, a call that hung, or
    #: transient errors all the way to the deadline. Another consumer may have it.
    LAPSED = "lapsed"
    #: The service refused the receipt: the message was deleted out of band, or
    #: received by another consumer since.
    REJECTED = "rejected"
    #: The same message was received again (with a new receipt) while leased here.
    SUPERSEDED = "superseded"
    #: The service refused the call for good: the queue is gone, the credentials or
    #: permissions were refused.
    FATAL = "fatal"
    #: The service's own cap on a message's total invisibility (SQS: 12 hours from
    #: the first receive) was reached: it cannot be extended any more.
    CAPPED = "capped"
    #: ``max_lease_duration`` was reached: leasekeeper stopped renewing on purpose.
    ABANDONED = "abandoned"
    #: The handler succeeded but its delete kept failing: left to lapse, so the
    #: message comes back and is done again rather than hidden for ever.
    DELETE_FAILED = "delete_failed"
    #: The handler made no progress (``held.progress()``) for ``stall_timeout``.
    STALLED = "stalled"
    #: The renewer process died; nothing renews its leases any more.
    RENEWER_DIED = "renewer_died"

    def __str__(self) -> str:
        return self.value


class Ending(NamedTuple):
    """How a lease ended: the reason of a loss (None for a completion, a release or
    a forget) and the human-readable detail (``lease.reason``). Never a receipt."""

    lost_reason: LostReason | None
    detail: str

    def __str__(self) -> str:
        return self.detail
