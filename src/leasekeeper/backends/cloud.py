"""``CloudBackend``, the base of the SQS, MNS, Azure and Redis backends: the
argument checks, the error table mapped to outcomes, the "whole call failed ->
one outcome per entry" fallback, ``ReceiveError`` for a failed receive or send,
the Message builder and the cap; and ``ThreadClients``, one SDK client per
thread, for SDKs whose clients must not be shared.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from leasekeeper.backends.contract import BackendSpec, Handle, Message, Outcome
from leasekeeper.backends.shared import (
    T,
    cap_margin,
    check_attributes,
    check_body,
    check_count,
    check_seconds,
    host_port,
    is_seconds,
    receive_count,
    whole_seconds,
)
from leasekeeper.clock import Clock
from leasekeeper.errors import ConfigError, ReceiveError, ReceiveErrorKind

# ---------------------------------------------------------------------- unreachable

#: The SDKs' exceptions that say no answer came from the service, by class name (no
#: SDK imported): botocore's ConnectionError family (refused, DNS, connect and read
#: timeouts, a closed connection, a proxy) and HTTPClientError, azure-core's
#: ServiceRequestError and ServiceResponseError, the MNS SDK's network exception,
#: redis-py's ConnectionError and TimeoutError.
NETWORK_ERRORS = frozenset(
    {
        "ConnectionError",
        "HTTPClientError",
        "ServiceRequestError",
        "ServiceResponseError",
        "MNSClientNetworkException",
        "TimeoutError",
    }
)


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says no answer came from the service: a connection refused or
    reset, a name that does not resolve, a timeout (an ``OSError``, or one of
    ``NETWORK_ERRORS`` or a subclass)."""
    return isinstance(exc, OSError) or any(
        kind.__name__ in NETWORK_ERRORS for kind in type(exc).__mro__
    )


def endpoint_address(backend: object) -> str:
    """``host:port`` of the endpoint ``backend``'s calls go to (never a credential, a
    path or a query): what a failure to reach it names. The first it has of: an
    ``endpoint`` (MNS), an ``account_url`` (Azure), a lean path's or a boto3
    client's endpoint (SQS: the queue URL is a parameter, not an address), its
    spec's URL (Redis)."""
    lean = getattr(backend, "lean", None)
    meta = None if lean is not None else getattr(getattr(backend, "client", None), "meta", None)
    for url in (
        getattr(backend, "endpoint", None),
        getattr(backend, "account_url", None),
        getattr(lean, "endpoint", None),
        getattr(meta, "endpoint_url", None),
    ):
        if isinstance(url, str) and url:
            return host_port(url)
    try:
        return host_port(str(getattr(backend.spec(), "url", "")))  # type: ignore[attr-defined]
    except Exception:  # no spec: nothing to name
        return "an unknown address"


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
        group: str | None = None,
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
            group=group,
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
        outcome = self.located(exc, self.classify(exc))
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

    def address(self) -> str:
        """``host:port`` of the endpoint its calls go to (``endpoint_address``)."""
        return endpoint_address(self)

    def located(self, exc: BaseException, outcome: Outcome) -> Outcome:
        """``outcome`` of ``exc``, whose detail names the endpoint when the service
        could not be reached: "could not reach localhost:5999 (EndpointConnectionError)"."""
        if outcome.kind != "retry" or not unreachable(exc):
            return outcome
        return outcome._replace(detail=f"could not reach {self.address()} ({outcome.detail})")

    def failure_note(self, exc: BaseException, receipts: Sequence[str]) -> str:
        """Extra words for the log line of a failure (the service's message, scrubbed;
        a request id). Never a receipt."""
        return ""

    def failed(self, operation: str, handles: Sequence[Handle], exc: BaseException) -> Outcome:
        """The outcome of a call that raised ``exc``, logged."""
        receipts = [handle.receipt for handle in handles]
        outcome = self.located(exc, self.classify(exc, receipts))
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
