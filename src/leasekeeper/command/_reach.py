"""Reaching the queues before the first receive: how ``leasekeeper worker`` starts.

The queue flags name one queue or several (a repeated ``--queue``, ``--sqs``,
``--mns`` or ``--azure``: ``each_queue``), checked against ``--weights``. The
command builds each queue's backend and asks its service about it once. A queue
that does not exist, or credentials it refuses, are a usage error at once; a
service that cannot be reached is tried again, with growing pauses, for up to
``REACH_WITHIN`` seconds (``--until-idle`` S, when shorter) - the rule a worker's
run follows too (docs/guide.md, "When a service cannot be reached") - and is then
a usage error naming its endpoint. A signal meanwhile ends the wait.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import select
import socket
import time
from collections.abc import Callable
from typing import TypeVar

from leasekeeper.backends.contract import Backend
from leasekeeper.backends.urls import redact_url
from leasekeeper.command._usage import UsageError
from leasekeeper.errors import ReceiveError
from leasekeeper.receiving import REACH_WITHIN, backoff

__all__ = [
    "Doorbell",
    "check_weights",
    "each_queue",
    "one_queue",
    "queue_spelled",
    "reach",
    "reach_queues",
    "retryable_cause",
]

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


QUEUE_FLAGS = ("queue", "sqs", "mns", "azure")


def each_queue(args: argparse.Namespace) -> list[argparse.Namespace]:
    """One namespace a queue the flags name (a repeated ``--queue``, ``--sqs``,
    ``--mns`` or ``--azure``), each with that one queue: ``--sqs URL``, ``--azure NAME``,
    ``--mns [ENDPOINT, QUEUE]``, ``--queue [URL]``."""
    for name in QUEUE_FLAGS:
        given = getattr(args, name, None)
        if not given:
            continue
        if name == "queue":
            return [argparse.Namespace(**{**vars(args), name: [one]}) for one in given]
        if isinstance(given, str) or (name == "mns" and isinstance(given[0], str)):
            return [args]  # one queue's already
        return [argparse.Namespace(**{**vars(args), name: one}) for one in given]
    return [args]


def one_queue(args: argparse.Namespace) -> argparse.Namespace:
    """The namespace of the one queue ``args`` names (a ValueError if several)."""
    queues = each_queue(args)
    if len(queues) != 1:
        raise ValueError(f"{len(queues)} queues, where one was expected")
    return queues[0]


def check_weights(args: argparse.Namespace, queues: int) -> None:
    """``--weights`` must give one weight a queue, and there must be several queues."""
    given = getattr(args, "weights", None)
    if given is None:
        return
    text = ",".join(str(weight) for weight in given)
    if queues < 2:
        raise UsageError(
            f"--weights {text} shares the receives among several queues, and there is one: "
            "repeat the queue flag (--queue URL --queue URL) or leave --weights out"
        )
    if len(given) != queues:
        raise UsageError(
            f"--weights {text} gives {len(given)} weight(s) for {queues} queues: give one a "
            f"queue, in their order (e.g. --weights {','.join(['1'] * queues)})"
        )


def queue_spelled(args: argparse.Namespace, backend: Backend | None = None) -> str:
    """The queue of ``args`` (one queue's namespace) as the user gave it."""
    if getattr(args, "queue", None):
        url = args.queue[0] if isinstance(args.queue, list) else args.queue
        # An SQS backend keeps the URL it was given; others' URLs are as spelled,
        # without a password.
        return redact_url(str(getattr(backend, "queue_url", None) or url))
    if args.sqs is not None:
        return str(args.sqs)
    if args.mns is not None:
        return " ".join(args.mns)
    return str(args.azure)


def reach_queues(
    args: argparse.Namespace, attempt: Callable[[argparse.Namespace], Backend], doorbell: Doorbell
) -> list[Backend] | None:
    """Every queue's backend, ``attempt(one queue's args)`` (built and asked about
    once); a service that cannot be reached is tried again for ``REACH_WITHIN``
    seconds (``--until-idle`` when shorter), then a UsageError. None: a signal came
    meanwhile."""
    queues = each_queue(args)
    check_weights(args, len(queues))
    within = min(REACH_WITHIN, args.until_idle or REACH_WITHIN)
    backends: list[Backend] = []
    for one in queues:
        what = f"the queue {queue_spelled(one)}"
        backend = reach(functools.partial(attempt, one), what, within=within, doorbell=doorbell)
        if backend is None:
            return None
        backends.append(backend)
    return backends
