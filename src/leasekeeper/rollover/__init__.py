"""``Rollover`` and ``Lineage``: a job that outlives the service's cap goes on as a new message.

A queue service caps how long one message may stay invisible (SQS: 12 hours from
its receive; ``backend.max_lease_age``). A job longer than that cannot keep its
message: with ``on_cap="rollover"`` leasekeeper sets ``lease.rolling`` well before
the cap, and the handler - having saved its progress with
``lease.checkpoint(state)`` - raises ``Rollover`` (itself, or through
``lease.check()``). leasekeeper then sends a *continuation*: the same body, with
the lineage (the first message's id, the hop number, the last checkpoint)
attached, and only then deletes the original. The worker that receives the
continuation reads ``lease.resumed`` (the checkpoint) and ``lease.lineage``.

Returning from the handler means the job is done: the message is deleted as ever.
See docs/outliving.md.
"""

from __future__ import annotations

from typing import NamedTuple

from leasekeeper.rollover._continuation import carried as carried
from leasekeeper.rollover._continuation import checkpoint_text as checkpoint_text
from leasekeeper.rollover._continuation import next_hop as next_hop
from leasekeeper.rollover._continuation import send_continuation as send_continuation
from leasekeeper.rollover._continuation import send_with_attributes as send_with_attributes
from leasekeeper.rollover._continuation import unwrap as unwrap

__all__ = ["Lineage", "Rollover"]


class Rollover(Exception):
    """Raised by a handler (or by ``lease.check()`` once ``lease.rolling`` is set) to
    hand its job on: leasekeeper sends a continuation of the message, carrying the
    last ``lease.checkpoint(state)``, then deletes the original.

    It is an ``Exception``: a handler that catches every ``Exception`` around
    ``lease.check()`` must let it through (``except Rollover: raise``).
    """

    def __init__(self, message: str = "rolling over before the service's cap") -> None:
        super().__init__(message)


class Lineage(NamedTuple):
    """Where a message stands in its job's chain of continuations: ``first_id`` is the
    id of the message the job started as, ``hop`` 0 on that original and k on its
    k-th continuation."""

    first_id: str
    hop: int
