"""The line between LeaseManager and a queue service, drawn with plain values.

Like httpx's transports, a backend is a thin mapping of calls and errors: it knows
nothing of leases, clocks or threads. The manager hands it ``Handle``s (message id
plus the newest receipt) in batches of at most ``max_batch``, and gets back one
``Outcome`` per entry, in order:

========  ===============================================================
ok        done; ``receipt`` is the new receipt where the service rotated it
lost      the service says the receipt is no longer valid: another worker
          may have the message now. Stop renewing, tell the handler.
retry     transient (throttling, 5xx, network): try again while time remains
capped    the service will not keep the message invisible any longer
          (a total-visibility limit); not lost yet, but cannot be extended
fatal     the queue is gone or the credentials are refused: retrying is futile
========  ===============================================================

Backends must be safe to call from several threads at once: the manager's
dispatch pool runs up to ``max_concurrency`` calls in parallel, and handler
threads call ``delete``/``release`` themselves.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal, NamedTuple, Protocol, TypeVar, runtime_checkable
from urllib.parse import quote

OutcomeKind = Literal["ok", "lost", "retry", "capped", "fatal"]


class Handle(NamedTuple):
    """What an extend, delete or release needs: the message id and its newest receipt."""

    message_id: str
    receipt: str  # secret: it authorises a delete

    def __repr__(self) -> str:
        return f"Handle(message_id={self.message_id!r}, receipt=<redacted>)"


class Outcome(NamedTuple):
    """The result of one entry of a backend call."""

    kind: OutcomeKind
    receipt: str | None = None  # the new receipt, where the service rotated it
    detail: str = ""  # error code or reason; never a receipt

    def __repr__(self) -> str:
        shown = "<redacted>" if self.receipt is not None else "None"
        return f"Outcome(kind={self.kind!r}, receipt={shown}, detail={self.detail!r})"


OK = Outcome("ok")


class Message:
    """A message as a backend's ``receive`` (or ``adopt``) returned it.

    ``body`` is a str for text payloads and bytes otherwise. ``raw`` is the SDK's own
    object. The receipt is kept private and never shown in ``repr``.

    The manager computes the message's deadline from what is recorded here, without
    asking the service again: ``received_at`` is the local monotonic time taken just
    *before* the receive request was sent, so ``received_at + visibility_timeout`` is
    never later than the service's own deadline. ``deadline_hint`` is a deadline the
    service reported, already converted to local monotonic time; it may only shorten
    the estimate. ``hard_deadline`` is the last local moment the service lets the
    message stay invisible at all (SQS: 12 h after the receive; Azure: its expiry),
    with the backend's safety margin already taken off.
    """

    __slots__ = (
        "__weakref__",
        "_receipt",
        "backend",
        "body",
        "deadline_hint",
        "ended_lease",
        "hard_deadline",
        "id",
        "raw",
        "receive_count",
        "received_at",
        "visibility_timeout",
    )

    def __init__(
        self,
        *,
        id: str,
        body: str | bytes,
        receipt: str,
        backend: Backend,
        received_at: float,
        visibility_timeout: float,
        receive_count: int = 1,
        raw: Any = None,
        deadline_hint: float | None = None,
        hard_deadline: float | None = None,
    ) -> None:
        self.id = id
        self.body = body
        # A weak reference to its lease once that ended, set by the renewal engine:
        # registering this very message again returns that lease, not a second one.
        self.ended_lease: Callable[[], Any] | None = None
        self._receipt = receipt
        self.backend = backend
        self.received_at = received_at
        self.visibility_timeout = visibility_timeout
        self.receive_count = receive_count
        self.raw = raw
        self.deadline_hint = deadline_hint
        self.hard_deadline = hard_deadline

    @property
    def receipt(self) -> str:
        """The receipt this message was received with (a secret: do not log it)."""
        return self._receipt

    @property
    def handle(self) -> Handle:
        return Handle(self.id, self._receipt)

    def with_backend(self, backend: Backend) -> Message:
        """A copy that names ``backend`` as its own: what a wrapper backend (one that
        adds faults, latency or counting around another) hands out, so leases route
        its extends and deletes through the wrapper."""
        return Message(
            id=self.id,
            body=self.body,
            receipt=self._receipt,
            backend=backend,
            received_at=self.received_at,
            visibility_timeout=self.visibility_timeout,
            receive_count=self.receive_count,
            raw=self.raw,
            deadline_hint=self.deadline_hint,
            hard_deadline=self.hard_deadline,
        )

    @property
    def visible_until(self) -> float:
        """Local monotonic time before which the message is known to be invisible."""
        local = self.received_at + self.visibility_timeout
        if self.deadline_hint is not None and self.deadline_hint < local:
            return self.deadline_hint
        return local

    def __repr__(self) -> str:
        body = self.body
        size = f"{len(body)} {'chars' if isinstance(body, str) else 'bytes'}"
        return (
            f"Message(id={self.id!r}, receive_count={self.receive_count}, "
            f"body=<{size}>, backend={self.backend!r})"
        )


@runtime_checkable
class Backend(Protocol):
    """What the manager needs of a queue service. See the module docstring."""

    max_batch: int  # entries per extend/delete/release call
    max_visibility: float  # the longest invisibility one call may set, seconds
    rotates_receipts: bool  # does every extend issue a new receipt?
    # Optional, read with getattr by Worker and leasekeeper.spark: ``max_receive``
    # (messages one receive may return) and ``max_wait_seconds`` (longest long poll).

    def receive(
        self,
        max_messages: int = 1,
        wait_seconds: float = 0.0,
        visibility_timeout: float | None = None,
    ) -> list[Message]: ...

    def adopt(self, raw: Any, visibility_timeout: float | None = None) -> Message: ...

    def extend(self, handles: Sequence[Handle], timeout: float) -> list[Outcome]: ...

    def delete(self, handles: Sequence[Handle]) -> list[Outcome]: ...

    def release(self, handles: Sequence[Handle], delay: float) -> list[Outcome]: ...


T = TypeVar("T")


def chunked(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """Split ``items`` into runs of at most ``size`` (a backend's ``max_batch``)."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


REDACTED = "<redacted>"
# (pattern, replacement) pairs a backend knows mark its secrets in free text.
Redactions = Sequence[tuple[re.Pattern[str], str]]


def redact(text: str, secrets: Iterable[str] = (), patterns: Redactions = ()) -> str:
    """``text`` with each known secret blanked, as written and URL-quoted (services
    and HTTP logs quote receipts back either way), then each pattern applied.

    The one place every backend blanks receipts, keys and signatures out of SDK
    errors and log records before leasekeeper lets them near a log line.
    """
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
            quoted = quote(secret, safe="")
            if quoted != secret:
                text = text.replace(quoted, REDACTED)
    for pattern, replacement in patterns:
        text = pattern.sub(replacement, text)
    return text
