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

Besides the protocol and its values, this module holds what backends share:

- ``CloudBackend``, the base of the SQS, MNS and Azure backends: argument checks
  and rounding to whole seconds, the error table (``ErrorTable``) mapped to
  ``Outcome``s, the "whole call failed -> one outcome per entry" fallback, and
  ``ReceiveError`` for every failed receive. ``ThreadClients`` keeps one SDK
  client per thread for SDKs whose clients must not be shared.
- ``ForwardingBackend``, the base of wrappers (fault injection, latency, spies):
  it forwards every call to the backend it wraps and re-points the messages it
  hands out at itself, so leases route their calls through the wrapper.
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import (
    TYPE_CHECKING,
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

if TYPE_CHECKING:
    from leasekeeper.backends.spec import BackendSpec

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
    object. ``receipt`` is a secret: it is never shown in ``repr``; do not log it.

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


# ---------------------------------------------------------------------- seconds

# Float noise ignored when rounding to whole seconds: 2.0000000001 s is 2 s. The
# service starts counting when the request reaches it, later than the moment the
# local deadline counts from by at least the request's transit, so 1e-9 s less
# than asked is still on the safe side.
_NOISE = 1e-9


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


# ---------------------------------------------------------------------- errors

_KIND_ORDER: tuple[OutcomeKind, ...] = ("lost", "capped", "fatal", "retry")


class ErrorTable:
    """A service's error codes, by the outcome each means.

    ``ErrorTable(lost=..., retry=..., fatal=..., bug=..., capped=...)``; ``bug``
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
        lost: Iterable[str] = (),
        retry: Iterable[str] = (),
        fatal: Iterable[str] = (),
        bug: Iterable[str] = (),
        capped: Iterable[str] = (),
    ) -> None:
        self.lost = frozenset(lost)
        self.retry = frozenset(retry)
        self.bug = frozenset(bug)
        self.fatal = frozenset(fatal) | self.bug
        self.capped = frozenset(capped)
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


# ---------------------------------------------------------------------- cloud backends

Operation = Literal["extend", "delete", "release"]
_Self = TypeVar("_Self", bound="CloudBackend")


class CloudBackend:
    """What the SQS, MNS and Azure backends share; a subclass supplies the SDK calls.

    The public methods check and round their arguments the same way for every
    service, then call the subclass:

    ==========================================  ======================================
    ``receive(max_messages, wait_seconds,        ``receive_messages(count, wait,
    visibility_timeout)``                        visibility)``
    ``extend(handles, timeout)``                 ``send_extend(handles, seconds)``
    ``release(handles, delay)``                  ``send_release(handles, seconds)``
    ``delete(handles)``                          ``send_delete(handles)``
    ``adopt(raw, visibility_timeout)``           (the subclass's own)
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
      A failure of the service raises ``ReceiveError`` (``receive_error`` builds it).
    - ``extend``: the timeout rounded **up**; outside 1..``max_visibility`` (or not
      a number) every entry is ``fatal`` and nothing is sent.
    - ``release``: the delay rounded **down**, at least ``min_release``, at most
      ``max_visibility``; negative or not a number: ``fatal``, nothing sent.
    - an empty batch answers ``[]`` without a call.

    ``per_entry`` and ``whole_call`` run the SDK calls and turn an exception into
    outcomes (``failed``): one outcome per entry, and a whole-call "lost" or
    "capped" on a batch of several (which does not say which entry it means) is
    resolved by asking again one entry at a time.
    """

    #: Names the service in errors and logs ("SQS", "MNS", "Azure queue").
    service: ClassVar[str] = "queue service"
    #: Where failures are logged (the backend module's logger).
    logger: ClassVar[logging.Logger] = logging.getLogger("leasekeeper.backends")
    #: The service's code for a malformed argument, for outcomes of calls not sent.
    bad_argument_code: ClassVar[str] = "InvalidArgument"
    #: The shortest visibility a receive may ask for, whole seconds.
    min_receive_visibility: ClassVar[int] = 1
    #: The shortest release delay the service takes, whole seconds.
    min_release: ClassVar[int] = 0

    max_batch: int = 1
    max_visibility: float
    rotates_receipts: bool
    max_receive: int
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

    def receive_error(self, exc: BaseException, operation: str = "receive") -> ReceiveError:
        """The ``ReceiveError`` for an exception a receive (or a read it needs) raised:
        "fatal" where the error table says so, "retry" for everything else."""
        outcome = self.classify(exc)
        kind: ReceiveErrorKind = "fatal" if outcome.kind == "fatal" else "retry"
        self.logger.debug("%s from %r failed (%s): %s", operation, self, kind, outcome.detail)
        return self.new_receive_error(kind, outcome.detail, operation, exc)

    def new_receive_error(
        self, kind: ReceiveErrorKind, detail: str, operation: str, exc: BaseException
    ) -> ReceiveError:
        """Build the error ``receive_error`` returns (a subclass may use its own type)."""
        return ReceiveError(kind, detail, operation=operation, service=self.service)

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

    def close(self) -> None:
        """Close the clients this backend made for itself (the SDK client or queue
        you passed in stays open: it is yours). Calls made afterwards still work."""

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# ---------------------------------------------------------------------- wrappers


class ForwardingBackend:
    """A backend that forwards every call to the backend it wraps: the base of
    wrappers that add faults, latency, counting or journaling around another.

    The contract, for people writing one:

    - ``ForwardingBackend(inner)``: ``self.inner`` is the wrapped backend. Its
      ``max_batch``, ``max_visibility`` and ``rotates_receipts``, and
      ``max_receive``, ``max_wait_seconds`` and ``clock`` when it has them, are
      copied at construction (they are constants of a backend).
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
        for name in ("max_receive", "max_wait_seconds", "clock"):
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
