"""Rule 5, decided in one place: when is a lease whose deadline passed lost?

A lease's deadline (``visible_until``, rule 1) is when the service may hand its
message to another consumer. What a call made or answered after it proves depends
on the service:

- **Receipts that do not rotate (SQS).** The service answers a late extend, delete
  or release with success whether or not another consumer received the message
  meanwhile - it checks nothing - so its answer proves nothing: the lease is lost,
  decided here, and a call not yet sent is not sent.
- **Receipts that rotate (MNS, Azure).** Every receive issues a new receipt, so a
  late call that succeeds proves nobody received the message since: the call is
  made and its answer believed (the lapse is still counted).

Whatever the service, a lease is lost when its deadline passed while its extend
call was still out (the answer may yet come, but the handler must stop now), or
after transient errors all the way to it. That last is the extender's verdict on
its own retries (``record.retries`` counts failed *extends*): a handler's delete or
release after the deadline - renewal stopped mid-retry by ``close(release=False)``,
say - has not been tried at all, and is judged by the service's half alone.

Every part of the engine asks ``lapsed`` and nothing else.
"""

from __future__ import annotations

from typing import Literal

from leasekeeper.reasons import Ending, LostReason
from leasekeeper.record import LeaseRecord

Operation = Literal["extend", "delete", "release"]
Moment = Literal["before sending", "answered", "call out", "retrying"]

_LAPSED = LostReason.LAPSED


def lapsed(record: LeaseRecord, at: float, operation: Operation, moment: Moment) -> Ending | None:
    """How ``record`` ends if ``operation`` at time ``at`` (``moment``: just before
    sending it, when its answer came, while its call is still out, or as a retry is
    planned) finds its deadline passed; None when the lease goes on."""
    if at < record.visible_until:
        return None
    if moment == "call out":
        return Ending(_LAPSED, f"lapsed: the {operation} call had not returned by the deadline")
    if moment == "retrying" or (
        moment == "before sending" and operation == "extend" and record.retries
    ):
        # Transient errors all the way to the deadline: the service's fault.
        return Ending(
            _LAPSED,
            f"lapsed: no successful {operation} before the deadline "
            f"(last error: {record.last_error or 'none'})",
        )
    if record.message.backend.rotates_receipts:
        return None  # the service itself tells a stale receipt from a live one
    if moment == "answered":
        return Ending(_LAPSED, f"lapsed: the {operation} was answered after the deadline")
    return Ending(_LAPSED, f"lapsed: its invisibility ran out before the {operation} was sent")
