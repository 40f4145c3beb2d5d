"""The line between LeaseManager and a queue service, drawn with plain values.

Like httpx's transports, a backend is a thin mapping of calls and errors: it knows
nothing of leases, clocks or threads. ``Backend`` below is the whole contract a
backend author needs: what each method takes, returns and raises, and which
answers mean lost, retry, capped or fatal; ``Handle``, ``Outcome`` and ``Message``
are the values that cross the line. ``tests/contract`` checks every backend
against it (a new backend is one more entry in its ``SUBJECTS``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable


@runtime_checkable
class BackendSpec(Protocol):
    """What ``backend.spec()`` returns: a picklable description of a queue that builds
    its backend elsewhere (``leasekeeper.backends.spec`` has them all)."""

    def build(self) -> Backend: ...


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


#: The attributes of a message that has none (shared: it is read-only).
NO_ATTRIBUTES: Mapping[str, str] = MappingProxyType({})


class Message:
    """A message as a backend's ``receive`` (or ``adopt``) returned it.

    ``body`` is a str for text payloads and bytes otherwise. ``attributes`` is a
    read-only mapping of str to str: the message's attributes (properties) as the
    service returned them, empty where it has none (see each backend). ``raw`` is
    the SDK's own object. ``receipt`` is a secret: it is never shown in ``repr``;
    do not log it. ``receive_count`` is how many times the service has handed the
    message out, this time included (1 on a first delivery).

    The manager computes the message's deadline from what is recorded here, without
    asking the service again: ``received_at`` is the local monotonic time taken just
    *before* the receive request was sent, so ``received_at + visibility_timeout`` is
    never later than the service's own deadline. ``deadline_hint`` is a deadline the
    service reported, already converted to local monotonic time; it may only shorten
    the estimate. ``hard_deadline`` is the last local moment the service lets the
    message stay invisible at all (``received_at + backend.max_lease_age``, or an
    Azure message's expiry), with the backend's safety margin already taken off;
    None where there is no cap.

    ``group`` is the message's group where the service has one (SQS MessageGroupId,
    on FIFO and standard queues alike): on a FIFO queue the group's messages are
    ordered; on a standard ("fair") queue it names a tenant. None where the service
    has no groups (MNS, Azure, Redis Streams unless a plug-in sets it).
    """

    __slots__ = (
        "__weakref__",
        "attributes",
        "backend",
        "body",
        "deadline_hint",
        "ended_lease",
        "group",
        "hard_deadline",
        "id",
        "raw",
        "receipt",
        "receive_count",
        "received_at",
        "visibility_timeout",
        "visible_until",
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
        attributes: Mapping[str, str] | None = None,
        group: str | None = None,
    ) -> None:
        self.id = id
        self.group = group
        self.body = body
        # A weak reference to its lease once that ended, set by the renewal engine:
        # registering this very message again returns that lease, not a second one.
        self.ended_lease: Callable[[], Any] | None = None
        self.receipt = receipt
        self.backend = backend
        self.received_at = received_at
        self.visibility_timeout = visibility_timeout
        self.receive_count = receive_count
        self.raw = raw
        self.deadline_hint = deadline_hint
        self.hard_deadline = hard_deadline
        self.attributes: Mapping[str, str] = (
            MappingProxyType(dict(attributes)) if attributes else NO_ATTRIBUTES
        )
        # Local monotonic time before which the message is known to be invisible:
        # computed once, as everything it derives from is fixed at receipt.
        local = received_at + visibility_timeout
        self.visible_until: float = (
            deadline_hint if deadline_hint is not None and deadline_hint < local else local
        )

    @property
    def handle(self) -> Handle:
        return Handle(self.id, self.receipt)

    def with_backend(self, backend: Backend) -> Message:
        """A copy that names ``backend`` as its own, the original left as it is.

        A wrapper backend does not need it: ``ForwardingBackend.wrap`` re-points the
        message its inner backend just made (no one else holds it) in place."""
        return Message(
            id=self.id,
            body=self.body,
            receipt=self.receipt,
            backend=backend,
            received_at=self.received_at,
            visibility_timeout=self.visibility_timeout,
            receive_count=self.receive_count,
            raw=self.raw,
            deadline_hint=self.deadline_hint,
            hard_deadline=self.hard_deadline,
            attributes=self.attributes,
            group=self.group,
        )

    def __repr__(self) -> str:
        body = self.body
        size = f"{len(body)} {'chars' if isinstance(body, str) else 'bytes'}"
        group = "" if self.group is None else f", group={self.group!r}"
        return (
            f"Message(id={self.id!r}, receive_count={self.receive_count}{group}, "
            f"body=<{size}>, backend={self.backend!r})"
        )


class QueueCounts(NamedTuple):
    """How many messages a queue holds, as the service counts them: approximately
    on the cloud services (SQS, MNS and Azure count a moment ago, and an SQS count
    may lag by a minute), exactly on MemoryQueue and Redis Streams. None where the
    service does not say.

    - ``visible``: could be received now (the backlog an autoscaler should read).
    - ``in_flight``: received and not yet deleted, hidden until their visibility
      ends (leased, or left by a worker that died).
    - ``delayed``: sent with a delay, not visible yet.
    - ``total``: every message, where the service counts only that (Azure Storage
      Queue's approximate count includes hidden ones); else the sum of the others.
    """

    visible: int | None
    in_flight: int | None
    delayed: int | None
    total: int | None = None

    @property
    def backlog(self) -> int | None:
        """The messages waiting for a worker: ``visible``, else ``total`` (Azure)."""
        return self.visible if self.visible is not None else self.total


@runtime_checkable
class Counter(Protocol):
    """A queue that counts its messages: the ``queue_counts`` capability of ``Backend``."""

    def queue_counts(self) -> QueueCounts: ...


@runtime_checkable
class Backend(Protocol):
    """What the manager needs of a queue service: the contract of a backend.

    **Attributes** (constants of a backend):

    - ``max_batch``: entries one ``extend``/``delete``/``release`` call takes. The
      manager never passes more; a backend may take more and split them.
    - ``max_visibility``: the longest invisibility one call may set, seconds.
    - ``rotates_receipts``: True when every successful extend or release issues a
      new receipt (MNS, Azure) and the old one stops working.

    **Optional capabilities**, read with ``getattr`` by the code that needs them
    (a wrapper or a minimal backend may lack them; every backend leasekeeper
    ships has them all):

    - ``max_receive``, ``max_wait_seconds``: the most messages one receive returns
      and the longest long poll (Worker and leasekeeper.spark size their calls).
    - ``max_lease_age``: seconds. The service's cap on one message's total
      invisibility, counted from the receive (SQS 43200; Azure 7 days, the default
      time-to-live; MNS, Redis Streams: ``math.inf``, none). ``Message.hard_deadline``
      follows from it. Overridable at construction for tests and compatible
      services (``SQSBackend(..., max_lease_age=...)``, ``MemoryQueue(max_lease_age=...)``).
    - ``send(body, attributes=None, *, delay=0.0) -> str``: put a new message on
      the queue (dead-letter copies, continuation messages); returns its id.
      ``body`` is str or bytes; ``attributes`` a mapping of str to str, which the
      receiver sees as ``Message.attributes``; ``delay`` seconds before it
      becomes visible (rounded down to whole seconds by the cloud services).
      ``carries_attributes`` (bool) says whether the service can carry
      attributes (Azure Storage Queue cannot): given attributes where it cannot,
      ``send`` raises ValueError and sends nothing - check the flag first, and
      carry them in the body where they must travel. A service without delayed
      delivery (Redis Streams) raises ValueError for ``delay > 0``. A failure of
      the service raises ``ReceiveError`` (operation "send"; "retry" or "fatal").
    - ``sibling(name, *, create=False) -> Backend``: a backend on another queue of
      the same account or endpoint, with the same credentials and options
      (``create=True`` creates the queue if it is missing). Queues of other
      accounts: ``leasekeeper.connect(url)``.
    - ``queue_counts() -> QueueCounts``: how many messages are visible, in flight
      and delayed, as the service counts them (one call: SQS GetQueueAttributes,
      MNS GetQueueAttributes, Azure's queue properties, Redis XLEN and XPENDING).
      A failure of the service raises ``ReceiveError`` (operation "counts").
    - ``fifo``: True for a queue that keeps each message group in order (an SQS
      queue whose URL ends in ``.fifo``, ``MemoryQueue(fifo=True)``): it hands a group
      out in order and nothing more of it while any of it is in flight, and the
      workers and ``leasekeeper.spark.drain`` handle one message of a group
      (``Message.group``) at a time. Its ``send`` takes ``group_id=``.
    - ``spec() -> BackendSpec``: a picklable description that builds an equivalent
      backend in another process (the process renewer, Spark executors); never
      holds a credential. ``leasekeeper.connect`` gives every backend it returns
      one (its URL and options). ``ConfigError`` where the backend cannot be
      rebuilt elsewhere (an in-memory queue, a wrapper).

    **Methods.** Every method may be called from several threads at once: the
    manager's dispatch pool runs up to ``max_concurrency`` calls in parallel, and
    handler threads call ``delete``/``release`` themselves.
    """

    max_batch: int
    max_visibility: float
    rotates_receipts: bool

    def receive(
        self,
        max_messages: int = 1,
        wait_seconds: float = 0.0,
        visibility_timeout: float | None = None,
    ) -> list[Message]:
        """Up to ``max_messages`` messages, hidden for ``visibility_timeout`` seconds
        (None: the queue's own), waiting up to ``wait_seconds`` for the first.

        Returns ``[]`` when none arrived. Each ``Message`` records ``received_at``
        (the local monotonic time read just before the request was sent) and the
        visibility it was hidden for, so the manager knows its deadline without
        asking again. Arguments no service takes raise ``TypeError``/``ValueError``
        before anything is sent: ``max_messages`` not an int >= 1 (more than
        ``max_receive`` is not an error: the call returns *up to* that many),
        ``wait_seconds`` not a finite number >= 0 (capped at ``max_wait_seconds``),
        ``visibility_timeout`` outside ``0..max_visibility``. A failure of the
        service raises ``ReceiveError``: "retry" (throttling, 5xx, network) or
        "fatal" (the queue is gone, the credentials are refused).
        """
        ...

    def adopt(self, raw: Any, visibility_timeout: float | None = None) -> Message:
        """A ``Message`` for an SDK message the caller received itself (the type
        ``Message.raw`` holds). Its receive time is unknown, so it counts from now,
        and any deadline the message itself reports may only shorten that.
        ``TypeError`` for an object of another type."""
        ...

    def extend(self, handles: Sequence[Handle], timeout: float) -> list[Outcome]:
        """Hide each message for ``timeout`` more seconds, counted from now.

        Returns one ``Outcome`` per handle, in order, and raises nothing for a
        failure of the service (an exception is a bug):

        - ``ok``: done; ``receipt`` is the new receipt where the service rotated it.
        - ``lost``: the service refused the receipt (the message was deleted, or
          received again by someone else): stop renewing, tell the handler.
        - ``retry``: transient (throttling, 5xx, network, an unknown error): the
          manager tries again while the lease has time. A lease is declared lost
          only on a definitive answer, or at its deadline.
        - ``capped``: the service will not keep the message invisible any longer
          (its total-visibility cap): not lost yet, but it cannot be extended.
        - ``fatal``: the queue is gone, the credentials are refused, or the request
          was malformed (a bug): retrying is futile. A ``timeout`` outside
          ``1..max_visibility`` (or not a number) is ``fatal`` for every entry,
          with nothing sent.

        ``detail`` names the error code and never quotes a receipt. An empty batch
        answers ``[]``.
        """
        ...

    def delete(self, handles: Sequence[Handle]) -> list[Outcome]:
        """Delete each message: one ``Outcome`` per handle, as ``extend``'s. A receipt
        the service no longer takes is ``lost`` (where the service answers a stale
        delete with success - SQS standard queues - it is ``ok``)."""
        ...

    def release(self, handles: Sequence[Handle], delay: float) -> list[Outcome]:
        """Make each message visible again after ``delay`` seconds (0: at once;
        never later than asked). One ``Outcome`` per handle, as ``extend``'s; a
        negative ``delay`` or one that is not a number is ``fatal``, nothing sent."""
        ...


@runtime_checkable
class Sender(Protocol):
    """A queue that takes new messages: the ``send`` capability of ``Backend``."""

    carries_attributes: bool

    def send(
        self, body: str | bytes, attributes: Mapping[str, str] | None = None, *, delay: float = 0.0
    ) -> str: ...


# ---------------------------------------------------------------------- cloud backends
Operation = Literal["extend", "delete", "release"]
