"""FIFO receives that fail in transit: the ReceiveRequestAttemptId to ask again with.

A ReceiveMessage on a FIFO queue that SQS carried out but whose answer was lost
(a reset connection, a timeout, a 5xx from a proxy) leaves its messages
invisible, and their message groups blocked, for a whole visibility timeout.
SQS's remedy: a ReceiveRequestAttemptId. A receive asked again with the same one
within five minutes answers the same messages and receipt handles (as long as
none of them was deleted or had its visibility changed). So every receive of a
FIFO queue carries one: the retries of one call (botocore's, or the lean
path's) send the very same request, and after a call that failed with a
transient error the next receive takes that attempt's id again
(``ReceiveAttempts``), once, within the five minutes.
"""

from __future__ import annotations

import os
import threading

from leasekeeper.clock import Clock

__all__ = ["REUSE_WITHIN", "ReceiveAttempts"]

#: SQS keeps an attempt id for five minutes; a margin for the clocks' and the
#: call's own time.
REUSE_WITHIN = 240.0


class ReceiveAttempts:
    """``take()``: the id for the next receive - that of a receive that failed in
    transit (``failed(id)``) less than ``REUSE_WITHIN`` seconds ago, taken by one
    receive only, else a new one. Thread-safe: two receives at once never share one
    (they would get the same messages)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._pending: tuple[str, float] | None = None

    def take(self) -> str:
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None and self.clock.now() - pending[1] < REUSE_WITHIN:
            return pending[0]
        return os.urandom(16).hex()

    def failed(self, attempt: str) -> None:
        """The receive that carried ``attempt`` failed in transit: the next asks again."""
        with self._lock:
            if self._pending is None:
                self._pending = (attempt, self.clock.now())
