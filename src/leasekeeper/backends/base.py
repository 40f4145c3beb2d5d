"""The line between LeaseManager and a queue service, drawn with plain values.

Like httpx's transports, a backend is a thin mapping of calls and errors: it knows
nothing of leases, clocks or threads. ``Backend`` below is the whole contract a
backend author needs: what each method takes, returns and raises, and which
answers mean lost, retry, capped or fatal. ``tests/contract`` checks every
backend against it (a new backend is one more entry in its ``SUBJECTS``).

Besides the contract and its values (``Handle``, ``Outcome``, ``Message``), this
module holds what every backend shares:

- argument checks and rounding (``check_count``, ``check_seconds``,
  ``check_attributes``, ``whole_seconds``), receipt scrubbing (``redact``,
  ``clean_code``), the clock-skew allowance for a service's timestamps
  (``SKEW_MARGIN``, ``epoch_seconds``), the margin kept before a service's cap
  (``cap_margin``) and the body of an SDK message (``text_body``);
- ``ErrorTable``: a service's error codes, by the outcome each means;
- ``ThreadClients``: one SDK client per thread, for SDKs whose clients must not
  be shared;
- ``CloudBackend``, the base of the SQS, MNS, Azure and Redis backends: the
  checks, the error table mapped to outcomes, the "whole call failed -> one
  outcome per entry" fallback, ``ReceiveError`` for a failed receive or send,
  the Message builder and the cap;
- ``ForwardingBackend``, the base of wrappers (fault injection, latency, spies).

What each service really does, and where the local stand-ins differ from it:
docs/backend-semantics.md.
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from types import MappingProxyType
from typing import (
    Any,
    ClassVar,
    Generic,
    Literal,
    NamedTuple,
    Protocol,
    TypeGuard,
    TypeVar,
    runtime_checkable,
)
from urllib.parse import quote

from leasekeeper.clock import Clock
from leasekeeper.errors import ConfigError, ReceiveError, ReceiveErrorKind


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
    """

    __slots__ = (
        "__weakref__",
        "attributes",
        "backend",
        "body",
        "deadline_hint",
        "ended_lease",
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
    ) -> None:
        self.id = id
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
        )

    def __repr__(self) -> str:
        body = self.body
        size = f"{len(body)} {'chars' if isinstance(body, str) else 'bytes'}"
        return (
            f"Message(id={self.id!r}, receive_count={self.receive_count}, "
            f"body=<{size}>, backend={self.backend!r})"
        )


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


# What an error code (or a request id) looks like: an identifier, never free text.
CODE_SHAPE = re.compile(r"[A-Za-z0-9._:#-]{1,100}")


def clean_code(code: object) -> str:
    """``code`` if it looks like an error code or a request id, else "": a value fit
    for an outcome's detail or a log line (anything else may quote a request)."""
    return code if isinstance(code, str) and CODE_SHAPE.fullmatch(code) else ""


def said(text: str) -> str:
    """A service's own message, already scrubbed, as a note for a log line."""
    return f"service said: {text}" if text else ""


# ---------------------------------------------------------------------- time

# Float noise ignored when rounding to whole seconds: 2.0000000001 s is 2 s. The
# service starts counting when the request reaches it, later than the moment the
# local deadline counts from by at least the request's transit, so 1e-9 s less
# than asked is still on the safe side.
_NOISE = 1e-9

#: ``adopt`` trusts a deadline the service's clock reports, less this much for skew.
SKEW_MARGIN = 0.5


def whole_seconds(seconds: float, *, up: bool) -> int:
    """``seconds`` as the whole seconds a service takes, never below 0.

    ``up=True`` where a longer real time is the safe side: an extend (the manager
    counts its deadline from the float it asked for) and a long poll (a fraction
    of a second must not become a 0 s poll, which would make an idle worker
    busy-poll). ``up=False`` where a shorter one is: a release delay (a released
    message is never held back longer than asked). Float noise is ignored either
    way. ``seconds`` must be a finite number (see ``is_seconds``).
    """
    value = math.ceil(seconds - _NOISE) if up else math.floor(seconds + _NOISE)
    return value if value > 0 else 0


def cap_margin(max_lease_age: float) -> float:
    """What a backend takes off its service's cap on total invisibility, so the
    manager stops extending before the service refuses: 60 s (rounding, call
    latency, an ``adopt`` made shortly after the receive), or 2 % of a cap shorter
    than 50 minutes (an overridden one, in tests)."""
    return min(60.0, 0.02 * max_lease_age)


def epoch_seconds(moment: object) -> float | None:
    """A service's timestamp as epoch seconds: a datetime (naive ones are UTC), or
    an int or numeric str of epoch milliseconds; None for anything else (or <= 1 ms:
    an SDK object that was never received says 1)."""
    if isinstance(moment, datetime):
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return float(moment.timestamp())
    if isinstance(moment, bool):
        return None
    try:
        ms = int(moment)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
    return ms / 1000.0 if ms > 1 else None


# ---------------------------------------------------------------------- arguments


def is_seconds(value: object) -> TypeGuard[float]:
    """True for a finite int or float (bool is not a number of seconds)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_count(name: str, value: object, limit: int) -> int:
    """An int >= 1 (else TypeError/ValueError naming ``name``), at most ``limit``: a
    receive returns *up to* that many messages, so asking for more than the service
    gives in one call is not an error."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value!r}")
    return min(value, limit)


def check_seconds(name: str, value: object, *, low: float = 0.0, high: float = math.inf) -> float:
    """``value`` as a float if it is a finite number of seconds in ``low..high``,
    else ValueError naming ``name``, the range and the value."""
    if is_seconds(value) and low <= value <= high:
        return float(value)
    upper = "" if high == math.inf else f" and <= {high:g}"
    raise ValueError(f"{name} must be a number of seconds >= {low:g}{upper}, got {value!r}")


def check_lease_age(value: object, default: float) -> float:
    """A ``max_lease_age`` given at construction (None: ``default``): a number of
    seconds > 0, ``math.inf`` for none."""
    if value is None:
        return default
    if value == math.inf or (is_seconds(value) and value > 0):
        return float(value)
    raise ValueError(f"max_lease_age must be a number of seconds > 0 (or math.inf), got {value!r}")


def check_body(body: object) -> str | bytes:
    """A message body to send: str or bytes, else TypeError."""
    if not isinstance(body, (str, bytes)):
        raise TypeError(f"body must be str or bytes, got {type(body).__name__}")
    return body


def check_attributes(
    attributes: Mapping[str, str] | None, *, carried: bool, service: str, limit: int | None = None
) -> dict[str, str]:
    """Attributes to send, as a dict of str to str: TypeError for anything else,
    ValueError where the service cannot carry them (``carried`` False) or more than
    ``limit`` are given. None or empty: ``{}``."""
    if not attributes:
        return {}
    if not isinstance(attributes, Mapping):
        raise TypeError(f"attributes must be a mapping of str to str, got {attributes!r}")
    out: dict[str, str] = {}
    for key, value in attributes.items():
        if not isinstance(key, str) or not isinstance(value, str) or not key:
            raise TypeError(
                f"attributes must map non-empty str names to str values, got {key!r}: {value!r}"
            )
        out[key] = value
    if not carried:
        raise ValueError(
            f"{service} messages carry no attributes (carries_attributes is False): "
            "send the body alone, or carry them in the body"
        )
    if limit is not None and len(out) > limit:
        raise ValueError(f"{service} carries at most {limit} attributes a message, got {len(out)}")
    return out


def text_body(content: object, *, decode: bool) -> str | bytes:
    """An SDK message's content as a ``Message.body``: str stays str; bytes (and
    bytearray, memoryview) stay bytes, or with ``decode`` become str when they are
    valid UTF-8 (an SDK that base64-decodes every body); None is ""."""
    if content is None:
        return ""
    if isinstance(content, (bytearray, memoryview)):
        content = bytes(content)
    if isinstance(content, bytes):
        if decode:
            try:
                return content.decode("utf-8")
            except UnicodeDecodeError:
                return content
        return content
    return content if isinstance(content, str) else str(content)


def receive_count(value: object) -> int:
    """A service's delivery count as ``Message.receive_count``: a positive int, or
    1 where the service gave none that makes sense."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


# ---------------------------------------------------------------------- errors

_KIND_ORDER: tuple[OutcomeKind, ...] = ("lost", "capped", "fatal", "retry")


Codes = Iterable[str]


def codes(given: Codes) -> frozenset[str]:
    """Error codes as a set: an iterable of them, or one str of whitespace-separated codes."""
    return frozenset(given.split() if isinstance(given, str) else given)


class ErrorTable:
    """A service's error codes, by the outcome each means.

    ``ErrorTable(lost=..., retry=..., fatal=..., bug=..., capped=...)``, each an
    iterable of codes or one str of whitespace-separated codes; ``bug``
    codes say the service rejected a request leasekeeper built (malformed: a bug,
    not a lost lease) and count as fatal. ``kind(*codes)`` is the outcome of the
    codes one error carries (SQS sends a legacy and a short name), the most
    definitive first (lost, capped, fatal, retry), or None when the table knows
    none of them: the backend then decides by HTTP status or exception type, and
    an unknown error is "retry" (a lease is declared lost only on a definitive
    answer, and at its deadline).
    """

    __slots__ = ("bug", "capped", "fatal", "lost", "retry")

    def __init__(
        self,
        *,
        lost: Codes = (),
        retry: Codes = (),
        fatal: Codes = (),
        bug: Codes = (),
        capped: Codes = (),
    ) -> None:
        self.lost = codes(lost)
        self.retry = codes(retry)
        self.bug = codes(bug)
        self.fatal = codes(fatal) | self.bug
        self.capped = codes(capped)
        groups = (self.lost, self.retry, self.fatal, self.capped)
        overlap = {code for i, a in enumerate(groups) for b in groups[i + 1 :] for code in a & b}
        if overlap:
            raise ValueError(f"codes in more than one group: {sorted(overlap)}")

    def _kind_of(self, code: str) -> OutcomeKind | None:
        if code in self.lost:
            return "lost"
        if code in self.capped:
            return "capped"
        if code in self.fatal:
            return "fatal"
        if code in self.retry:
            return "retry"
        return None

    def kind(self, *codes: str) -> OutcomeKind | None:
        """The outcome kind of an error carrying ``codes``, or None if none is known."""
        kinds = {self._kind_of(code) for code in codes}
        for kind in _KIND_ORDER:
            if kind in kinds:
                return kind
        return None

    def is_bug(self, code: str) -> bool:
        return code in self.bug


# ---------------------------------------------------------------------- per-thread clients

C = TypeVar("C")


class _Slot(threading.local):
    client: Any = None
    pid: int = 0
    generation: int = -1


class ThreadClients(Generic[C]):
    """One SDK client per thread, for SDKs whose clients must not be shared.

    ``ThreadClients(make, close_client, logger)``. ``get()`` is the calling
    thread's client, made by ``make()`` on the thread's first call, again in a
    forked child (a socket must not be shared between processes) and again after
    ``close()``. ``close()`` closes every client made so far with
    ``close_client`` (errors are logged, not raised); calls made afterwards get new
    clients. Clients must be weak-referenceable (SDK objects are): a client whose
    thread ended is dropped with it.
    """

    def __init__(
        self,
        make: Callable[[], C],
        close_client: Callable[[C], None],
        logger: logging.Logger,
    ) -> None:
        self._make = make
        self._close_client = close_client
        self._logger = logger
        self._slot = _Slot()
        # Guards _made and _generation.
        self._lock = threading.Lock()
        self._made: weakref.WeakSet[Any] = weakref.WeakSet()
        self._generation = 0  # bumped by close(): every thread then makes a new client

    def get(self) -> C:
        slot = self._slot
        client = slot.client
        pid = os.getpid()
        if client is None or slot.pid != pid or slot.generation != self._generation:
            client = self._make()
            with self._lock:
                self._made.add(client)
                slot.generation = self._generation
            slot.client = client
            slot.pid = pid
        return client  # type: ignore[no-any-return]

    def close(self) -> None:
        with self._lock:
            clients = list(self._made)
            self._made = weakref.WeakSet()
            self._generation += 1
        for client in clients:
            try:
                self._close_client(client)
            except Exception as exc:
                self._logger.debug("closing a per-thread client failed: %s", type(exc).__name__)


class ReadOnce(Generic[T]):
    """A queue setting read from the service once, then cached: ``get()`` reads it
    on first use (one read however many threads ask at once), ``forget()`` makes
    the next ``get()`` read it again. ``value`` given: known, never read."""

    def __init__(self, read: Callable[[], T], value: T | None = None) -> None:
        self._read = read
        self._value = value
        # Held during the read: concurrent first callers wait for the one read.
        self._lock = threading.Lock()

    def get(self) -> T:
        value = self._value
        if value is not None:
            return value
        with self._lock:
            if self._value is None:
                self._value = self._read()
            return self._value

    def forget(self) -> None:
        with self._lock:
            self._value = None


# ---------------------------------------------------------------------- cloud backends

Operation = Literal["extend", "delete", "release"]
_Self = TypeVar("_Self", bound="CloudBackend")


class CloudBackend:
    """What the leasekeeper backends of real services share; a subclass supplies
    the SDK calls.

    The public methods check and round their arguments the same way for every
    service, then call the subclass:

    ==========================================  ======================================
    ``receive(max_messages, wait_seconds,        ``receive_messages(count, wait,
    visibility_timeout)``                        visibility)``
    ``extend(handles, timeout)``                 ``send_extend(handles, seconds)``
    ``release(handles, delay)``                  ``send_release(handles, seconds)``
    ``delete(handles)``                          ``send_delete(handles)``
    ``send(body, attributes, delay=)``           ``send_message(body, attributes, seconds)``
    ``adopt(raw, visibility_timeout)``           (the subclass's own)
    ``sibling(name, create=)``, ``spec()``       (the subclass's own)
    an SDK exception                             ``classify(exc, receipts) -> Outcome``
    ==========================================  ======================================

    - ``receive``: ``max_messages`` an int >= 1 (TypeError/ValueError otherwise),
      capped at ``max_receive``; ``wait_seconds`` a finite number >= 0 (ValueError),
      capped at ``max_wait_seconds`` where the service has a long poll; a
      subclass rounds it **up** to whole seconds (``whole_seconds``), so 0.5 s is a
      1 s poll, never a 0 s one. That is safe for the deadlines: ``received_at``
      is read just before the request is sent and a message is hidden from the
      moment the service hands it out, so a longer poll never makes the local
      deadline later than the service's; it only leaves a message that arrives
      late in the poll with less *known* invisibility. ``visibility_timeout`` is
      None (the queue's own) or a number of seconds up to ``max_visibility`` that,
      rounded up, is at least ``min_receive_visibility`` (ValueError otherwise).
      A failure of the service raises ``ReceiveError`` (``receive_error`` builds
      it; ``call`` runs an SDK call and raises it).
    - ``extend``: the timeout rounded **up**; outside 1..``max_visibility`` (or not
      a number) every entry is ``fatal`` and nothing is sent.
    - ``release``: the delay rounded **down**, at least ``min_release``, at most
      ``max_visibility``; negative or not a number: ``fatal``, nothing sent.
    - ``send``: the body str or bytes, the attributes checked (``check_attributes``:
      ``carries_attributes``, ``attribute_limit``), the delay a number of seconds up
      to ``max_send_delay``, rounded **down**.
    - an empty batch answers ``[]`` without a call.

    ``per_entry`` and ``whole_call`` run the SDK calls and turn an exception into
    outcomes (``failed``): one outcome per entry, and a whole-call "lost" or
    "capped" on a batch of several (which does not say which entry it means) is
    resolved by asking again one entry at a time. ``new_message`` builds each
    ``Message``, its ``hard_deadline`` from ``max_lease_age``.
    """

    #: Names the service in errors and logs ("SQS", "MNS", "Azure queue").
    service: ClassVar[str] = "queue service"
    #: What the service calls a receipt ("receipt handle", "pop receipt").
    receipt_name: ClassVar[str] = "receipt"
    #: Where failures are logged (the backend module's logger).
    logger: ClassVar[logging.Logger] = logging.getLogger("leasekeeper.backends")
    #: The service's code for a malformed argument, for outcomes of calls not sent.
    bad_argument_code: ClassVar[str] = "InvalidArgument"
    #: The shortest visibility a receive may ask for, whole seconds.
    min_receive_visibility: ClassVar[int] = 1
    #: The shortest release delay the service takes, whole seconds.
    min_release: ClassVar[int] = 0
    #: Can a message carry attributes? The most one may carry (None: no limit).
    carries_attributes: ClassVar[bool] = False
    attribute_limit: ClassVar[int | None] = None
    #: The longest delay ``send`` takes, seconds.
    max_send_delay: ClassVar[float] = 0.0
    #: Chain the SDK's exception to a ReceiveError? Only where its text can quote no
    #: receipt, URL or key.
    chains_errors: ClassVar[bool] = False

    max_batch: int = 1
    max_visibility: float
    rotates_receipts: bool
    max_receive: int
    max_lease_age: float = math.inf
    #: Taken off ``max_lease_age`` for ``Message.hard_deadline`` (None: ``cap_margin``).
    hard_deadline_margin: float | None = None
    clock: Clock

    # ------------------------------------------------------------------ receive

    def receive(
        self,
        max_messages: int = 1,
        wait_seconds: float = 0.0,
        visibility_timeout: float | None = None,
    ) -> list[Message]:
        count = check_count("max_messages", max_messages, self.max_receive)
        wait = check_seconds("wait_seconds", wait_seconds)
        # Optional in the protocol: a service without a long poll (Azure) has none.
        limit: float | None = getattr(self, "max_wait_seconds", None)
        if limit is not None:
            wait = min(wait, limit)
        visibility: float | None = None
        if visibility_timeout is not None:
            visibility = check_seconds(
                "visibility_timeout", visibility_timeout, high=self.max_visibility
            )
            if whole_seconds(visibility, up=True) < self.min_receive_visibility:
                raise ValueError(
                    f"visibility_timeout must be more than {self.min_receive_visibility - 1} "
                    f"seconds ({self.service} takes whole seconds from "
                    f"{self.min_receive_visibility}), got {visibility_timeout!r}"
                )
        return self.receive_messages(count, wait, visibility)

    def receive_messages(self, count: int, wait: float, visibility: float | None) -> list[Message]:
        """Receive up to ``count`` messages, waiting up to ``wait`` seconds, hidden for
        ``visibility`` seconds (None: the queue's own). Arguments are checked."""
        raise NotImplementedError

    def adopt(self, raw: Any, visibility_timeout: float | None = None) -> Message:
        """A Message for an SDK message you received yourself (each backend's own)."""
        raise NotImplementedError

    def new_message(
        self,
        *,
        id: object,
        receipt: object,
        body: str | bytes,
        raw: Any,
        received_at: float,
        visibility: float,
        count: object = 1,
        attributes: Mapping[str, str] | None = None,
        deadline_hint: float | None = None,
        hard_deadline: float | None = None,
    ) -> Message:
        """The ``Message`` for an SDK message: ValueError where it has no id or no
        receipt (it was peeked or sent, not received), ``count`` made a positive
        int, and ``hard_deadline`` (None: ``received_at + max_lease_age`` less
        ``cap_margin``) never later than that."""
        if not isinstance(id, str) or not id:
            raise ValueError(f"the {self.service} message has no id: it cannot be leased")
        if not isinstance(receipt, str) or not receipt:
            raise ValueError(
                f"message {id!r} has no {self.receipt_name} (was it peeked or sent rather "
                "than received?): it cannot be leased"
            )
        capped = self.hard_deadline_after(received_at)
        if capped is not None and (hard_deadline is None or capped < hard_deadline):
            hard_deadline = capped
        return Message(
            id=id,
            body=body,
            receipt=receipt,
            backend=self,
            received_at=received_at,
            visibility_timeout=visibility,
            receive_count=receive_count(count),
            raw=raw,
            deadline_hint=deadline_hint,
            hard_deadline=hard_deadline,
            attributes=attributes,
        )

    def hard_deadline_after(self, received_at: float) -> float | None:
        """The last local moment a message received at ``received_at`` may stay
        invisible, the margin taken off; None where the service has no cap."""
        age = self.max_lease_age
        if age == math.inf:
            return None
        margin = self.hard_deadline_margin
        return received_at + age - (cap_margin(age) if margin is None else margin)

    def adopt_visibility(self, visibility_timeout: object) -> float:
        """``adopt``'s ``visibility_timeout``: a number of seconds >= 0 (ValueError)."""
        return check_seconds("visibility_timeout", visibility_timeout)

    # ------------------------------------------------------------------ errors of queue calls

    def receive_error(self, exc: BaseException, operation: str = "receive") -> ReceiveError:
        """The ``ReceiveError`` for an exception a receive, a send or a queue read
        raised: "fatal" where the error table says so, "retry" for everything else."""
        outcome = self.classify(exc)
        kind: ReceiveErrorKind = "fatal" if outcome.kind == "fatal" else "retry"
        self.logger.debug("%s from %r failed (%s): %s", operation, self, kind, outcome.detail)
        return self.new_receive_error(kind, outcome.detail, operation, exc)

    def new_receive_error(
        self, kind: ReceiveErrorKind, detail: str, operation: str, exc: BaseException
    ) -> ReceiveError:
        """Build the error ``receive_error`` returns (a subclass may use its own type)."""
        return ReceiveError(kind, detail, operation=operation, service=self.service)

    def call(self, operation: str, send: Callable[[], T]) -> T:
        """``send()``, an SDK call that is not about a lease (a receive, a send, a
        queue read): its exception becomes a ``ReceiveError``, chained to it only
        where ``chains_errors`` (the SDK's text may quote a request)."""
        try:
            return send()
        except Exception as exc:
            error = self.receive_error(exc, operation)
            if self.chains_errors:
                raise error from exc
        # Raised outside the except block: neither chained nor shown as context.
        raise error

    # ------------------------------------------------------------------ producing

    def send(
        self, body: str | bytes, attributes: Mapping[str, str] | None = None, *, delay: float = 0.0
    ) -> str:
        """Put a new message on the queue; returns its id (see ``Backend``)."""
        return self.send_message(body, *self.send_arguments(body, attributes, delay))

    def send_arguments(
        self, body: object, attributes: Mapping[str, str] | None, delay: object
    ) -> tuple[dict[str, str], int]:
        """``send``'s checks: the attributes as a dict and the delay in whole seconds."""
        check_body(body)
        attrs = check_attributes(
            attributes,
            carried=self.carries_attributes,
            service=self.service,
            limit=self.attribute_limit,
        )
        if self.max_send_delay == 0 and is_seconds(delay) and delay > 0:
            raise ValueError(f"{self.service} has no delayed delivery: send with delay=0")
        seconds = check_seconds("delay", delay, high=self.max_send_delay)
        return attrs, whole_seconds(seconds, up=False)

    def send_message(self, body: str | bytes, attributes: dict[str, str], delay: int) -> str:
        """Send one message (arguments checked); raise via ``call`` on failure."""
        raise NotImplementedError

    def sibling(self, name: str, *, create: bool = False) -> CloudBackend:
        """A backend on queue ``name`` of the same account or endpoint (see ``Backend``)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the manager's calls

    def extend(self, handles: Sequence[Handle], timeout: float) -> list[Outcome]:
        if not handles:
            return []
        seconds = whole_seconds(timeout, up=True) if is_seconds(timeout) else -1
        if not 1 <= seconds <= self.max_visibility:
            return self.not_sent(
                handles, f"extend by {timeout!r}s is outside 1..{self.max_visibility:g}s"
            )
        return self.send_extend(handles, seconds)

    def release(self, handles: Sequence[Handle], delay: float) -> list[Outcome]:
        if not handles:
            return []
        if not (is_seconds(delay) and delay >= 0):
            return self.not_sent(handles, f"release delay {delay!r}s is not a number >= 0")
        seconds = max(self.min_release, whole_seconds(delay, up=False))
        return self.send_release(handles, min(seconds, int(self.max_visibility)))

    def delete(self, handles: Sequence[Handle]) -> list[Outcome]:
        if not handles:
            return []
        return self.send_delete(handles)

    def send_extend(self, handles: Sequence[Handle], seconds: int) -> list[Outcome]:
        raise NotImplementedError

    def send_release(self, handles: Sequence[Handle], seconds: int) -> list[Outcome]:
        raise NotImplementedError

    def send_delete(self, handles: Sequence[Handle]) -> list[Outcome]:
        raise NotImplementedError

    def not_sent(self, handles: Sequence[Handle], why: str) -> list[Outcome]:
        """``fatal`` for every entry of a call leasekeeper refused to send (a bug)."""
        return [Outcome("fatal", detail=f"{self.bad_argument_code}: {why} (not sent)")] * len(
            handles
        )

    # ------------------------------------------------------------------ errors

    def classify(self, exc: BaseException, receipts: Sequence[str] = ()) -> Outcome:
        """The outcome an exception from the SDK means, by the service's error table.
        The detail names the error code and never quotes ``receipts`` (or any)."""
        raise NotImplementedError

    def failure_note(self, exc: BaseException, receipts: Sequence[str]) -> str:
        """Extra words for the log line of a failure (the service's message, scrubbed;
        a request id). Never a receipt."""
        return ""

    def failed(self, operation: str, handles: Sequence[Handle], exc: BaseException) -> Outcome:
        """The outcome of a call that raised ``exc``, logged."""
        receipts = [handle.receipt for handle in handles]
        outcome = self.classify(exc, receipts)
        self.log_failure(operation, handles, outcome, self.failure_note(exc, receipts))
        return outcome

    def log_failure(
        self, operation: str, handles: Sequence[Handle], outcome: Outcome, note: str = ""
    ) -> None:
        # Lost and transient answers are the manager's to report; a cap, a fatal or
        # an unrecognised code is worth an operator's attention.
        quiet = outcome.kind in ("lost", "retry") and not outcome.detail.endswith("unrecognised")
        level = logging.DEBUG if quiet else logging.WARNING
        if not self.logger.isEnabledFor(level):
            return
        what = (
            f"message {handles[0].message_id!r}" if len(handles) == 1 else f"{len(handles)} entries"
        )
        self.logger.log(
            level,
            "%s of %s on %r: %s (%s)%s",
            operation,
            what,
            self,
            outcome.kind,
            outcome.detail,
            f"; {note}" if note else "",
        )

    def per_entry(
        self, operation: str, handles: Sequence[Handle], send: Callable[[Handle], Outcome]
    ) -> list[Outcome]:
        """``send`` each handle on its own (a service without that batch call)."""
        out: list[Outcome] = []
        for handle in handles:
            try:
                out.append(send(handle))
            except Exception as exc:
                out.append(self.failed(operation, [handle], exc))
        return out

    def whole_call(
        self,
        operation: str,
        handles: Sequence[Handle],
        send: Callable[[Sequence[Handle]], list[Outcome]],
    ) -> list[Outcome]:
        """One batch call; if it raises, every entry gets the error's outcome.

        A whole-call "lost" or "capped" on several entries is about *one* receipt
        but does not say which: each entry is sent again on its own, so only the
        guilty lease ends.
        """
        try:
            return send(handles)
        except Exception as exc:
            outcome = self.failed(operation, handles, exc)
        if outcome.kind in ("lost", "capped") and len(handles) > 1:
            return [
                found for handle in handles for found in self.whole_call(operation, [handle], send)
            ]
        return [outcome] * len(handles)

    # ------------------------------------------------------------------ lifetime

    def spec(self) -> BackendSpec:
        """A picklable description that builds an equivalent backend in another
        process (``leasekeeper.backends.spec``); never holds a credential."""
        raise ConfigError(f"{type(self).__name__} has no spec(): it cannot be rebuilt elsewhere")

    def credentials_problem(self) -> str | None:
        """Why a backend built from ``spec()`` in another process on this machine
        would have no credentials, found without a request; None when it would, or
        cannot tell. A worker asks while it starts a renewer process, which
        inherits its environment (an SDK that finds credentials only at the first
        call would fail every renewal there)."""
        return None

    def close(self) -> None:
        """Close the clients this backend made for itself (the SDK client or queue
        you passed in stays open: it is yours). Calls made afterwards still work."""

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# ---------------------------------------------------------------------- wrappers


# The optional constants a wrapper copies from the backend it wraps.
_COPIED = ("max_receive", "max_wait_seconds", "max_lease_age", "carries_attributes", "clock")


class ForwardingBackend:
    """A backend that forwards every call to the backend it wraps: the base of
    wrappers that add faults, latency, counting or journaling around another.

    The contract, for people writing one:

    - ``ForwardingBackend(inner)``: ``self.inner`` is the wrapped backend. Its
      ``max_batch``, ``max_visibility`` and ``rotates_receipts``, and
      ``max_receive``, ``max_wait_seconds``, ``max_lease_age``,
      ``carries_attributes`` and ``clock`` when it has them, are copied at
      construction (they are constants of a backend); ``send`` is forwarded.
    - Every message ``receive`` and ``adopt`` hand out passes through
      ``wrap(message)``, which re-points it at the wrapper (``message.backend =
      self``: the inner backend just made that message and nobody else holds it)
      so the manager sends its extends, deletes and releases through the wrapper.
      Override ``wrap`` to look at each message (call ``super().wrap``).
    - ``extend``, ``delete`` and ``release`` call the inner backend's directly, one
      method call each. Override the ones you need and call ``super()`` (or
      ``forward``) to reach the inner backend; each must answer one ``Outcome``
      per handle, in order. ``forward(operation, handles, arg)`` is the same
      three calls by name, for a wrapper that treats them alike.
    - Errors pass through untouched: a failed receive still raises the inner
      backend's ``ReceiveError``.
    """

    max_batch: int
    max_visibility: float
    rotates_receipts: bool
    # Set only when the inner backend has them (read with getattr by Worker and spark,
    # and the clock by wrappers of wrappers).
    max_receive: int
    max_wait_seconds: float
    max_lease_age: float
    carries_attributes: bool
    clock: Clock

    def __init__(self, inner: Backend) -> None:
        if not isinstance(inner, Backend):
            raise TypeError(
                f"{type(self).__name__} wraps a leasekeeper backend, got {type(inner).__name__}"
            )
        self.inner = inner
        self.max_batch = inner.max_batch
        self.max_visibility = inner.max_visibility
        self.rotates_receipts = inner.rotates_receipts
        for name in _COPIED:
            if hasattr(inner, name):
                setattr(self, name, getattr(inner, name))

    def wrap(self, message: Message) -> Message:
        """Re-point ``message`` (just made by the inner backend) at this wrapper."""
        message.backend = self
        return message

    def receive(
        self,
        max_messages: int = 1,
        wait_seconds: float = 0.0,
        visibility_timeout: float | None = None,
    ) -> list[Message]:
        wrap = self.wrap
        return [
            wrap(message)
            for message in self.inner.receive(max_messages, wait_seconds, visibility_timeout)
        ]

    def adopt(self, raw: Any, visibility_timeout: float | None = None) -> Message:
        return self.wrap(self.inner.adopt(raw, visibility_timeout))

    def extend(self, handles: Sequence[Handle], timeout: float) -> list[Outcome]:
        return self.inner.extend(handles, timeout)

    def delete(self, handles: Sequence[Handle]) -> list[Outcome]:
        return self.inner.delete(handles)

    def release(self, handles: Sequence[Handle], delay: float) -> list[Outcome]:
        return self.inner.release(handles, delay)

    def send(
        self, body: str | bytes, attributes: Mapping[str, str] | None = None, *, delay: float = 0.0
    ) -> str:
        """The inner backend's ``send`` (AttributeError where it has none)."""
        sender: Sender = self.inner  # type: ignore[assignment]
        return sender.send(body, attributes, delay=delay)

    def forward(self, operation: Operation, handles: Sequence[Handle], arg: float) -> list[Outcome]:
        """The inner backend's ``operation``; ``arg`` is the extend's timeout or the
        release's delay (ignored for a delete)."""
        if operation == "extend":
            return self.inner.extend(handles, arg)
        if operation == "release":
            return self.inner.release(handles, arg)
        if operation == "delete":
            return self.inner.delete(handles)
        raise ValueError(f"unknown operation {operation!r}")

    def spec(self) -> BackendSpec:
        """A wrapper's faults, latency or counting live in this process: it cannot be
        rebuilt in another one. Override to return the inner backend's spec when
        renewing without the wrapper is what you want."""
        raise ConfigError(
            f"{type(self).__name__} wraps {self.inner!r} in this process and cannot be "
            "rebuilt in another one (renewer='process' needs a backend with spec())"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"
