"""Reaching the queues before the first receive: how ``leasekeeper worker`` starts.

The command builds each queue's backend and asks its service about it once. A queue
that does not exist, or credentials it refuses, are a usage error at once; a
service that cannot be reached is tried again, with growing pauses, for up to
``REACH_WITHIN`` seconds (``--until-idle`` S, when shorter) - the rule a worker's
run follows too (docs/guide.md, "When a service cannot be reached") - and is then
a usage error naming its endpoint. A signal meanwhile ends the wait.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import time
from collections.abc import Callable
from typing import TypeVar

from leasekeeper.command._usage import UsageError
from leasekeeper.errors import ReceiveError
from leasekeeper.receiving import backoff

__all__ = ["Doorbell", "reach", "retryable_cause"]

T = TypeVar("T")

log = logging.getLogger("leasekeeper.worker")


class Doorbell:
    """Rung from a signal handler, waited for with a timeout: a socket pair, which a
    handler may write to at any moment (a lock it might interrupt may not be taken)."""

    def __init__(self) -> None:
        self._read, self._write = socket.socketpair()
        self._write.setblocking(False)
        self.rung = False

    def ring(self) -> None:
        self.rung = True
        with contextlib.suppress(OSError):  # full: rung already
            self._write.send(b"\0")

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a ring; True once rung."""
        if not self.rung:
            select.select([self._read], [], [], max(0.0, timeout))
        return self.rung

    def close(self) -> None:
        self._read.close()
        self._write.close()


def retryable_cause(exc: BaseException) -> ReceiveError | None:
    """The retryable ``ReceiveError`` behind ``exc`` (itself, or what it was raised
    from): the service could not be reached, or answered with a transient error."""
    for error in (exc, exc.__cause__):
        if isinstance(error, ReceiveError) and error.retryable:
            return error
    return None


def reach(attempt: Callable[[], T], what: str, *, within: float, doorbell: Doorbell) -> T | None:
    """``attempt()``, tried again while it fails with a retryable ``ReceiveError``,
    for up to ``within`` seconds; then a ``UsageError`` naming ``what`` and the last
    error. None: a signal came meanwhile."""
    started = time.monotonic()
    failures = 0
    said = ""  # the failure last said at WARNING: the same one again is said at DEBUG
    while True:
        try:
            return attempt()
        except (ReceiveError, UsageError) as exc:
            cause = retryable_cause(exc)
            if cause is None:
                raise
        failures += 1
        left = started + within - time.monotonic()
        if left <= 0:
            raise UsageError(f"cannot reach {what} (tried for {within:g}s): {cause}") from cause
        level = logging.DEBUG if str(cause) == said else logging.WARNING
        said = str(cause)
        log.log(level, "cannot reach %s yet (%s); trying again for %.0fs more", what, cause, left)
        if doorbell.wait(min(backoff(failures), left)):
            return None
