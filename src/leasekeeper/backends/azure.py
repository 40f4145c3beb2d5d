"""AzureQueueBackend: leasekeeper on Azure Storage Queue, through azure-storage-queue 12.x.

::

    from azure.storage.queue import QueueClient
    from leasekeeper import LeaseManager
    from leasekeeper.backends.azure import AzureQueueBackend

    client = QueueClient.from_connection_string(conn_str, "jobs")
    backend = AzureQueueBackend(client)
    with LeaseManager(backend, visibility_timeout=60) as manager:
        for message in backend.receive(max_messages=32, wait_seconds=20):
            with manager.lease(message):
                handle(message.body)

How Azure Storage Queue maps onto the backend contract (see docs/backends/azure.md):

- Every receive and every Update Message issues a **new** pop receipt and kills the
  previous one, so ``rotates_receipts`` is True and every successful extend or
  release answers ``Outcome("ok", receipt=<new>)``. The manager never runs an
  extend and a delete of one lease at once, so a delete always carries the
  receipt the last extend returned.
- There is no batch API: ``max_batch`` is 1 and the manager runs extends in
  parallel from its dispatch pool.
- ``extend``/``release`` call ``update_message(id, pop_receipt=..., visibility_timeout=n)``
  with the message **id** (a QueueMessage would make the SDK re-upload its
  content) and ``visibility_timeout`` **always** given (the SDK sends 0 when it is
  left out: the message would reappear at once). The timeout is an int: extends
  round **up** (the manager counts its deadline from the float it asked for, so a
  longer real invisibility is the safe side); release delays round **down** (a
  released message is never held back longer than asked).
- A message cannot outlive its ``expires_on`` (its time-to-live). ``Message.hard_deadline``
  is ``expires_on`` converted to local monotonic time minus ``expiry_margin`` (2 s by
  default, which also covers the round-up above), so the manager stops extending
  and reports the lease "capped" before the service deletes the message. Azure
  has no "beyond the expiry" error (it accepts such an update and deletes the
  message at its expiry anyway), so the backend also refuses locally, as
  ``capped``, an extend that would pass a known expiry, and reports a
  ``MessageNotFound`` for a message whose expiry has passed as ``capped``.
- Azure has no long poll: ``receive(wait_seconds=...)`` re-polls with a backing-off
  pause (0.2 s doubling to 2 s) until a message arrives or ``wait_seconds`` runs out.

Threads: the manager extends from up to ``max_concurrency`` threads at once, and
handler threads delete and release. A ``QueueClient`` sends through one
azure-core ``RequestsTransport``, which says of itself that it is not thread-safe
(one ``requests.Session`` per transport, opened lazily without a lock), and
azure-core makes no thread-safety promise for the sync pipeline. So this backend
does not share one client between threads: extend, delete and release go through
a client per thread (``leasekeeper.backends.base.ThreadClients``), built from the
given client's URL, credential and API version (or by ``client_factory``), with
the SDK's own retries off (the manager retries with its own, much shorter,
backoff) and short network timeouts. The client you pass is used only for
``receive``, one request at a time, so your message decode policy (text or binary)
and encryption settings apply.

Errors are mapped by ``classify_error`` on the service's error code. ``Outcome.detail``
carries the error code (and, for a rejected query parameter, its name) and never
the service's message text: an error about the pop receipt quotes it, and network
errors quote the request URL, which carries ``popreceipt=``. The urllib3 and
azure-storage loggers log request URLs at DEBUG level, so the backend installs a
filter on them that blanks pop receipts and SAS signatures out of their records.
A failed receive raises ``AzureQueueError``, a ``leasekeeper.errors.ReceiveError``.
"""

from __future__ import annotations

import logging
import math
import os
import random
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

try:
    from azure.core.exceptions import (
        AzureError,
        ClientAuthenticationError,
        HttpResponseError,
        ResourceNotFoundError,
        ServiceRequestError,
        ServiceResponseError,
    )
    from azure.storage.queue import QueueClient, QueueMessage
except ImportError as _exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "leasekeeper.backends.azure needs azure-storage-queue, which is not installed: "
        "pip install 'leasekeeper[azure]'"
    ) from _exc

from leasekeeper.backends import credentials
from leasekeeper.backends.base import (
    CloudBackend,
    ErrorTable,
    Handle,
    Message,
    Outcome,
    OutcomeKind,
    ThreadClients,
    is_seconds,
    redact,
    whole_seconds,
)
from leasekeeper.clock import SYSTEM_CLOCK, Clock, DrivenClock
from leasekeeper.errors import ConfigError, ReceiveError, ReceiveErrorKind

__all__ = ["AzureQueueBackend", "AzureQueueError", "classify_error", "scrub"]

log = logging.getLogger("leasekeeper.backends.azure")

MAX_BATCH = 1  # no batch update/delete in the Queue service
MAX_MESSAGES = 32  # per Get Messages call
MAX_VISIBILITY = 604800  # 7 days: per Update Message / Get Messages call
DEFAULT_VISIBILITY = 30.0  # the service's default for Get Messages
DEFAULT_EXPIRY_MARGIN = 2.0
# adopt() trusts the service's clock for next_visible_on; allow this much skew.
ADOPT_SKEW_MARGIN = 0.5
# Per-thread clients: fail fast rather than sit on a lease's remaining time.
DEFAULT_CONNECTION_TIMEOUT = 5.0
DEFAULT_READ_TIMEOUT = 15.0
# receive(wait_seconds=...) re-polls with this backoff (Azure has no long poll).
_POLL_FIRST = 0.2
_POLL_MAX = 2.0

_LOST_CODES = frozenset({"MessageNotFound", "PopReceiptMismatch"})
_RETRY_CODES = frozenset({"ServerBusy", "InternalError", "OperationTimedOut"})
_FATAL_CODES = frozenset(
    {
        "QueueNotFound",
        "QueueBeingDeleted",
        "QueueDisabled",
        "ResourceNotFound",
        "AccountIsDisabled",
        "AuthenticationFailed",
        "InvalidAuthenticationInfo",
        "AuthorizationFailure",
        "AuthorizationPermissionMismatch",
        "AuthorizationProtocolMismatch",
        "AuthorizationResourceTypeMismatch",
        "AuthorizationServiceMismatch",
        "AuthorizationSourceIPMismatch",
        "InsufficientAccountPermissions",
        "KeyVaultAccessTokenCannotBeAcquired",
        "KeyVaultEncryptionKeyNotFound",
    }
)
# The service says the request leasekeeper built is malformed: a bug, not a lost lease.
_BUG_CODES = frozenset(
    {
        "OutOfRangeQueryParameterValue",
        "InvalidQueryParameterValue",
        "MissingRequiredQueryParameter",
        "UnsupportedQueryParameter",
        "InvalidUri",
        "InvalidInput",
        "InvalidHttpVerb",
        "InvalidHeaderValue",
        "MissingRequiredHeader",
        "UnsupportedHeader",
        "InvalidXmlDocument",
        "InvalidXmlNodeValue",
        "EmptyMetadataKey",
        "UnsupportedHttpVerb",
    }
)
ERRORS = ErrorTable(lost=_LOST_CODES, retry=_RETRY_CODES, fatal=_FATAL_CODES, bug=_BUG_CODES)

_CODE_SHAPE = re.compile(r"[A-Za-z0-9._-]{1,100}")
# What may carry a secret in text the SDK, urllib3 or the service produce.
_SECRET_PATTERNS = (
    # popreceipt=... in a request URL (and its URL-encoded forms)
    (re.compile(r"(?i)(pop_?receipt(?:=|%3D)|popreceipt(?:=|%3D))[^&\s'\"<>]*"), r"\1<redacted>"),
    # <PopReceipt>...</PopReceipt> in a response body
    (re.compile(r"(?i)(<PopReceipt>)[^<]*"), r"\1<redacted>"),
    # 'x-ms-popreceipt': '...' (logged response headers)
    (re.compile(r"(?i)(x-ms-popreceipt['\"]?\s*[:=]\s*['\"]?)[^'\"\s,}]*"), r"\1<redacted>"),
    # pop_receipt='...' / pop_receipt: ... in reprs
    (re.compile(r"(?i)(pop_receipt['\"]?\s*[:=]\s*['\"]?)[^'\"\s,)}]*"), r"\1<redacted>"),
    # the value of a rejected query parameter, quoted back by the service
    (re.compile(r"(?i)(queryparametervalue\s*[:=]\s*)[^\n]*"), r"\1<redacted>"),
    (re.compile(r"(?i)(<QueryParameterValue>)[^<]*"), r"\1<redacted>"),
    # SAS signatures and account keys
    (re.compile(r"(?i)(\bsig(?:=|%3D))[^&\s'\"<>]*"), r"\1<redacted>"),
    (re.compile(r"(?i)(AccountKey=)[^;\s'\"]*"), r"\1<redacted>"),
    (re.compile(r"(?i)(SharedKey [^:\s]+:)[^\s'\"]*"), r"\1<redacted>"),
)


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with the given secrets, pop receipts, SAS signatures and keys blanked."""
    return redact(text, secrets, _SECRET_PATTERNS)


class _RedactingFilter(logging.Filter):
    """Blanks pop receipts and SAS signatures out of third-party log records.

    urllib3 logs every request line, query string included, at DEBUG level, and
    azure-storage's network-trace policy logs URLs and headers when a client has
    ``logging_enable=True``: both would put pop receipts in the logs.
    """

    _HINTS = ("popreceipt", "pop_receipt", "sig=", "accountkey=", "queryparametervalue")

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # a malformed record is the logging module's business
            return True
        lowered = text.lower()
        if any(hint in lowered for hint in self._HINTS):
            record.msg = scrub(text)
            record.args = None
        return True


_FILTER = _RedactingFilter()
_FILTERED_LOGGERS = (
    "urllib3.connectionpool",
    "azure.storage.queue._shared.policies",
    "azure.core.pipeline.policies.http_logging_policy",
)
_filter_lock = threading.Lock()


def _install_log_filter() -> None:
    with _filter_lock:
        for name in _FILTERED_LOGGERS:
            logger = logging.getLogger(name)
            if _FILTER not in logger.filters:
                logger.addFilter(_FILTER)


def _code_of(exc: BaseException) -> str:
    """The service's error code as a plain str ("" when there is none or it looks odd)."""
    code: Any = getattr(exc, "error_code", None)
    if code is None:
        return ""
    value = getattr(code, "value", code)  # StorageErrorCode is a str-enum
    if not isinstance(value, str) or not _CODE_SHAPE.fullmatch(value):
        return ""
    return value


def _status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    if status is None:
        response = getattr(exc, "response", None)
        status = getattr(response, "status_code", None)
    return status if isinstance(status, int) and not isinstance(status, bool) else None


def _parameter_of(exc: BaseException) -> str:
    """The name (never the value) of the query parameter the service rejected."""
    info = getattr(exc, "additional_info", None)
    if isinstance(info, dict):
        for key, value in info.items():
            named = str(key).lower() == "queryparametername" and isinstance(value, str)
            if named and _CODE_SHAPE.fullmatch(value):
                return str(value)
    return ""


def classify_error(exc: BaseException) -> tuple[OutcomeKind, str]:
    """Map an exception from the SDK to an outcome kind and a detail.

    The detail names the error code and HTTP status (or the exception type), never
    the exception's text, which can quote a pop receipt or a request URL.

    - lost: MessageNotFound (404), PopReceiptMismatch (400 or 404), and a 404
      with no error code;
    - fatal: QueueNotFound, AuthenticationFailed, AuthorizationFailure and the
      other 401/403, account- and queue-state codes, other 4xx; and
      OutOfRangeQueryParameterValue, InvalidQueryParameterValue and the other
      malformed-request codes (a bug: the detail says so and names the parameter);
    - retry: ServerBusy, InternalError, OperationTimedOut, any 5xx, 408, 429,
      ServiceRequestError, ServiceResponseError (and their timeout subclasses),
      OSError (connection errors, timeouts) and anything unexpected.
    """
    if isinstance(exc, HttpResponseError):
        code = _code_of(exc)
        status = _status_of(exc)
        where = f" (HTTP {status})" if status is not None else ""
        label = f"{code or type(exc).__name__}{where}"
        kind = _http_kind(exc, code, status)
        if ERRORS.is_bug(code):
            parameter = _parameter_of(exc)
            named = f" [{parameter}]" if parameter else ""
            label = f"{label}{named}: the service rejected a request leasekeeper built"
        return kind, label
    if isinstance(exc, (ServiceRequestError, ServiceResponseError, OSError, AzureError)):
        # Connection refused/reset, DNS, timeouts (their *TimeoutError subclasses).
        return "retry", type(exc).__name__
    return "retry", f"unexpected {type(exc).__name__}"


def _http_kind(exc: HttpResponseError, code: str, status: int | None) -> OutcomeKind:
    kind: OutcomeKind
    known = ERRORS.kind(code) if code else None
    if known is not None:
        kind = known
    elif isinstance(exc, ClientAuthenticationError) or status in (401, 403):
        kind = "fatal"
    elif status is not None and (status >= 500 or status in (408, 429)):
        kind = "retry"
    elif status == 404 or isinstance(exc, ResourceNotFoundError):
        # A message operation's 404 without a code we know: the message is gone.
        kind = "fatal" if code else "lost"
    elif status is not None and 400 <= status < 500:
        kind = "fatal"
    else:
        kind = "retry"  # no status: the answer never arrived whole
    return kind


class AzureQueueError(ReceiveError):
    """A receive failed: Azure's ``ReceiveError``. ``kind`` is "retry" (transient) or
    "fatal"; ``detail`` the code.

    The text is built from the error code only: the SDK's own exception (whose
    text can quote URLs, SAS signatures included) is not chained.
    """

    def __init__(self, operation: str, kind: ReceiveErrorKind, detail: str) -> None:
        super().__init__(kind, detail, operation=operation, service="Azure queue")


def _epoch(moment: Any) -> float | None:
    if not isinstance(moment, datetime):
        return None
    if moment.tzinfo is None:  # the SDK's datetimes are UTC
        moment = moment.replace(tzinfo=timezone.utc)
    return float(moment.timestamp())


# Secrets a connection string may carry: they must reach another process through
# its environment, not through a pickled spec that may be shipped and logged.
SECRET_KEYS = ("accountkey=", "sharedaccesssignature=")


class AzureQueueBackend(CloudBackend):
    """leasekeeper's backend for one Azure Storage queue.

    ``AzureQueueBackend(queue_client, *, clock=None, client_factory=None,
    expiry_margin=2.0)``. ``queue_client`` is an ``azure.storage.queue.QueueClient``;
    it is used for ``receive`` (so its message decode policy decides whether bodies
    are str or bytes). Extends, deletes and releases go through one client per
    thread, made by ``client_factory()`` when given (use it to carry proxy, retry
    or transport settings), otherwise from ``queue_client``'s URL, credential and
    API version with the SDK's retries off and short network timeouts.
    """

    service = "Azure queue"
    logger = log
    bad_argument_code = "OutOfRangeQueryParameterValue [visibilitytimeout]"
    min_receive_visibility = 1
    min_release = 0

    max_batch = MAX_BATCH
    max_visibility = float(MAX_VISIBILITY)
    rotates_receipts = True
    max_receive = MAX_MESSAGES  # messages per Get Messages

    def __init__(
        self,
        queue_client: QueueClient,
        *,
        clock: Clock | None = None,
        client_factory: Callable[[], QueueClient] | None = None,
        expiry_margin: float = DEFAULT_EXPIRY_MARGIN,
    ) -> None:
        if not isinstance(queue_client, QueueClient):
            raise TypeError(
                "AzureQueueBackend takes an azure.storage.queue.QueueClient, got "
                f"{type(queue_client).__module__}.{type(queue_client).__qualname__}"
            )
        if client_factory is not None and not callable(client_factory):
            raise TypeError("client_factory must be a callable returning a QueueClient")
        if (
            isinstance(expiry_margin, bool)
            or not isinstance(expiry_margin, (int, float))
            or not (math.isfinite(expiry_margin) and expiry_margin >= 1.0)
        ):
            # Below 1 s the round-up of an extend's timeout could pass the expiry.
            raise ValueError(
                f"expiry_margin must be a number >= 1.0 seconds, got {expiry_margin!r}"
            )
        self.queue_client = queue_client
        self.clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self.expiry_margin = float(expiry_margin)
        self.account_name: str = str(getattr(queue_client, "account_name", None) or "?")
        self.queue_name: str = str(queue_client.queue_name)
        self._factory = client_factory
        self._driven = isinstance(self.clock, DrivenClock)
        self._clients = ThreadClients(self._new_client, _close_client, log)
        # Guards _expiry; _receive_lock serialises use of queue_client.
        self._lock = threading.Lock()
        self._receive_lock = threading.Lock()
        self._expiry: dict[str, float] = {}  # message id -> expires_on, epoch seconds
        self._expiry_inserts = 0
        self._closed = threading.Event()
        self._rng = random.Random()
        _install_log_filter()

    def spec(self) -> AzureQueueSpec:
        """This account and queue; the credential from the other process's environment
        (``AZURE_STORAGE_SAS_TOKEN``, ``AZURE_STORAGE_ACCOUNT_KEY``,
        ``AZURE_STORAGE_CONNECTION_STRING``) or ``DefaultAzureCredential``."""
        url = str(self.queue_client.url).split("?", 1)[0].rstrip("/")  # no SAS token
        suffix = "/" + self.queue_name
        account_url = url[: -len(suffix)] if url.endswith(suffix) else url
        return AzureQueueSpec(
            self.queue_name, account_url=account_url, account_name=self.account_name
        )

    def __repr__(self) -> str:
        return f"AzureQueueBackend(account={self.account_name!r}, queue={self.queue_name!r})"

    # ------------------------------------------------------------------ clients

    def _new_client(self) -> QueueClient:
        if self._factory is not None:
            return self._factory()
        source = self.queue_client
        credential: Any = source.credential
        return QueueClient.from_queue_url(
            source.url,  # carries a SAS token, if that is the credential
            credential=credential,
            api_version=source.api_version,
            retry_total=0,
            connection_timeout=DEFAULT_CONNECTION_TIMEOUT,
            read_timeout=DEFAULT_READ_TIMEOUT,
        )

    def _client(self) -> QueueClient:
        """This thread's own client (a new one after a fork: sockets are not shared)."""
        return self._clients.get()

    def close(self) -> None:
        """Close the per-thread clients this backend made and end any receive wait.

        The ``queue_client`` you passed in stays open: it is yours. Calls made after
        ``close()`` still work (through new clients), but ``receive`` no longer waits.
        """
        self._closed.set()
        self._clients.close()

    def __enter__(self) -> AzureQueueBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ expiry

    def _remember_expiry(self, message_id: str, expires: float | None) -> None:
        if expires is None:
            return
        with self._lock:
            self._expiry[message_id] = expires
            self._expiry_inserts += 1
            if self._expiry_inserts >= 4096:
                # Messages that were never deleted or released here (lost, abandoned)
                # are forgotten once they have expired.
                self._expiry_inserts = 0
                wall = self.clock.wall()
                for key in [k for k, v in self._expiry.items() if v < wall]:
                    del self._expiry[key]

    def _forget(self, message_id: str) -> None:
        with self._lock:
            self._expiry.pop(message_id, None)

    def _known_expiry(self, message_id: str) -> float | None:
        with self._lock:
            return self._expiry.get(message_id)

    # ------------------------------------------------------------------ receiving

    def receive(
        self,
        max_messages: int = 1,
        wait_seconds: float = 0.0,
        visibility_timeout: float | None = None,
    ) -> list[Message]:
        """Receive up to ``max_messages`` (at most 32 a call) messages.

        Azure has no long poll: with ``wait_seconds`` the queue is polled again,
        pausing 0.2 s and doubling up to 2 s, until a message arrives or the time
        is up. ``visibility_timeout`` (0 < T <= 604800 s, default 30) is sent
        rounded up to whole seconds; the message records the value asked for, so
        its local deadline is never later than the service's. A failure raises
        ``AzureQueueError`` (a ``ReceiveError``).
        """
        return super().receive(max_messages, wait_seconds, visibility_timeout)

    def receive_messages(self, count: int, wait: float, visibility: float | None) -> list[Message]:
        vis = DEFAULT_VISIBILITY if visibility is None else visibility
        sent = whole_seconds(vis, up=True)
        deadline = self.clock.now() + wait
        pause = _POLL_FIRST
        while True:
            received_at = self.clock.now()  # just before the request: rule 1
            page = self._receive_page(count, sent)
            if page:
                return self._messages(page, received_at, vis)
            left = deadline - self.clock.now()
            if left <= 0 or self._driven or self._closed.is_set():
                return []
            self._closed.wait(min(pause * self._rng.uniform(0.8, 1.2), left))
            pause = min(pause * 2, _POLL_MAX)

    def _receive_page(self, count: int, visibility: int) -> list[QueueMessage]:
        try:
            with self._receive_lock:
                pager = self.queue_client.receive_messages(
                    messages_per_page=count, max_messages=count, visibility_timeout=visibility
                )
                # One page is one Get Messages call; iterating further would poll again.
                page = next(iter(pager.by_page()), None)
                return [] if page is None else list(page)
        except Exception as exc:
            error = self.receive_error(exc)
        # Raised outside the except block: the SDK's exception, whose text may quote
        # the request URL, is neither chained nor shown as context.
        raise error

    def new_receive_error(
        self, kind: ReceiveErrorKind, detail: str, operation: str, exc: BaseException
    ) -> AzureQueueError:
        return AzureQueueError(operation, kind, detail)

    def _messages(self, page: list[QueueMessage], received_at: float, vis: float) -> list[Message]:
        now = self.clock.now()
        offset = self.clock.wall() - now  # epoch - monotonic, read together
        out: list[Message] = []
        for raw in page:
            out.append(self._message(raw, received_at, vis, offset, hint_margin=0.0))
        return out

    def _message(
        self,
        raw: QueueMessage,
        received_at: float,
        vis: float,
        offset: float,
        *,
        hint_margin: float,
    ) -> Message:
        message_id = str(raw.id)
        receipt = raw.pop_receipt
        if not isinstance(receipt, str) or not receipt:
            raise ValueError(
                f"message {message_id!r} has no pop receipt (was it peeked rather than "
                "received?): it cannot be leased"
            )
        visible_epoch = _epoch(raw.next_visible_on)
        hint = None if visible_epoch is None else visible_epoch - offset - hint_margin
        expires = _epoch(raw.expires_on)
        hard = None if expires is None else expires - offset - self.expiry_margin
        self._remember_expiry(message_id, expires)
        count = raw.dequeue_count
        return Message(
            id=message_id,
            body=_body(raw.content),
            receipt=receipt,
            backend=self,
            received_at=received_at,
            visibility_timeout=vis,
            receive_count=count if isinstance(count, int) and count > 0 else 1,
            raw=raw,
            deadline_hint=hint,
            hard_deadline=hard,
        )

    def adopt(self, raw: Any, visibility_timeout: float | None = None) -> Message:
        """Turn a ``QueueMessage`` you received yourself into a Message to register.

        The time it was received is not known, so the local estimate counts
        ``visibility_timeout`` from now and the message's ``next_visible_on`` (the
        service's clock, less a 0.5 s skew allowance) may only shorten it. Without
        ``visibility_timeout`` the estimate is ``next_visible_on`` alone.
        """
        if not isinstance(raw, QueueMessage):
            raise TypeError(
                f"AzureQueueBackend.adopt() takes an azure.storage.queue.QueueMessage, "
                f"got {type(raw).__name__}"
            )
        if not raw.id:
            raise ValueError("the QueueMessage has no id")
        now = self.clock.now()
        offset = self.clock.wall() - now
        if visibility_timeout is None:
            visible_epoch = _epoch(raw.next_visible_on)
            if visible_epoch is None:
                raise ValueError(
                    f"message {raw.id!r} has no next_visible_on: pass visibility_timeout"
                )
            vis = max(0.0, visible_epoch - offset - ADOPT_SKEW_MARGIN - now)
        else:
            if not (is_seconds(visibility_timeout) and visibility_timeout >= 0):
                raise ValueError(
                    f"visibility_timeout must be a number of seconds >= 0, got "
                    f"{visibility_timeout!r}"
                )
            vis = float(visibility_timeout)
        return self._message(raw, now, vis, offset, hint_margin=ADOPT_SKEW_MARGIN)

    # ------------------------------------------------------------------ the manager's calls

    def extend(self, handles: Sequence[Handle], timeout: float) -> list[Outcome]:
        """Update Message with ``visibility_timeout=ceil(timeout)``; a new receipt each."""
        return super().extend(handles, timeout)

    def release(self, handles: Sequence[Handle], delay: float) -> list[Outcome]:
        """Update Message with ``visibility_timeout=floor(delay)`` (0: visible at once)."""
        return super().release(handles, delay)

    def send_extend(self, handles: Sequence[Handle], seconds: int) -> list[Outcome]:
        client = self._client()
        out: list[Outcome] = []
        for handle in handles:
            expiry = self._known_expiry(handle.message_id)
            if expiry is not None and self.clock.wall() + seconds > expiry:
                out.append(
                    Outcome(
                        "capped",
                        detail=f"extend by {seconds}s would pass the message's expires_on",
                    )
                )
                continue
            outcome = self._update(client, "extend", handle, seconds)
            # Gone at (about) its expiry: the local check above missed it only by
            # clock skew. The lease ran into the TTL cap rather than being lost.
            expired = expiry is not None and self.clock.wall() >= expiry - self.expiry_margin
            if expired and outcome.kind == "lost" and outcome.detail.startswith("MessageNotFound"):
                outcome = Outcome("capped", detail="MessageNotFound: the message expired")
                self._forget(handle.message_id)
            out.append(outcome)
        return out

    def send_release(self, handles: Sequence[Handle], seconds: int) -> list[Outcome]:
        client = self._client()
        out: list[Outcome] = []
        for handle in handles:
            outcome = self._update(client, "release", handle, seconds)
            if outcome.kind in ("ok", "lost"):
                self._forget(handle.message_id)
            out.append(outcome)
        return out

    def send_delete(self, handles: Sequence[Handle]) -> list[Outcome]:
        client = self._client()
        out: list[Outcome] = []
        for handle in handles:
            try:
                client.delete_message(handle.message_id, handle.receipt)
            except Exception as exc:
                out.append(self.failed("delete", [handle], exc))
                continue
            self._forget(handle.message_id)
            out.append(Outcome("ok"))
        return out

    def _update(self, client: QueueClient, operation: str, handle: Handle, seconds: int) -> Outcome:
        try:
            # The id, not the QueueMessage (that would re-upload its content), and
            # visibility_timeout always given (left out, the SDK sends 0).
            answer = client.update_message(
                handle.message_id, pop_receipt=handle.receipt, visibility_timeout=seconds
            )
        except Exception as exc:
            outcome = self.failed(operation, [handle], exc)
            if outcome.kind == "lost":
                self._forget(handle.message_id)
            return outcome
        receipt = getattr(answer, "pop_receipt", None)
        if not isinstance(receipt, str) or not receipt:
            # The old receipt is dead and the new one is unknown: the lease is gone.
            return Outcome("lost", detail="no pop receipt in the Update Message answer")
        return Outcome("ok", receipt=receipt)

    def classify(self, exc: BaseException, receipts: Sequence[str] = ()) -> Outcome:
        """``classify_error`` (its detail never quotes the exception's text)."""
        kind, detail = classify_error(exc)
        return Outcome(kind, detail=detail)


def _close_client(client: QueueClient) -> None:
    client.close()


def _body(content: Any) -> str | bytes:
    if content is None:
        return ""
    if isinstance(content, (str, bytes)):
        return content
    if isinstance(content, (bytearray, memoryview)):
        return bytes(content)
    return str(content)


@dataclass(frozen=True)
class AzureQueueSpec:
    """An Azure Storage queue.

    With neither ``connection_string`` nor ``account_url``, the connection string
    comes from ``AZURE_STORAGE_CONNECTION_STRING`` in the building process's
    environment. With ``account_url``, the credential comes from
    ``AZURE_STORAGE_SAS_TOKEN`` or ``AZURE_STORAGE_ACCOUNT_KEY`` (for account
    ``account_name``, or the first label of the URL's host), else from
    ``AZURE_STORAGE_CONNECTION_STRING``, else ``azure.identity.DefaultAzureCredential``.
    A ``connection_string`` given here must hold no secret (no AccountKey or
    SharedAccessSignature): the spec is pickled and shipped.
    """

    queue_name: str
    connection_string: str | None = None
    account_url: str | None = None
    account_name: str | None = None

    def __post_init__(self) -> None:
        if self.connection_string is not None and any(
            key in self.connection_string.lower() for key in SECRET_KEYS
        ):
            raise ValueError(
                f"{type(self).__name__}: this connection string holds a secret, and the spec "
                "is pickled and shipped; set AZURE_STORAGE_CONNECTION_STRING in the building "
                "process's environment instead (the renewer inherits the worker's; on Spark, "
                "the executors' environment: spark.executorEnv.AZURE_STORAGE_CONNECTION_STRING)"
            )
        if self.connection_string is not None and self.account_url is not None:
            raise ValueError(
                f"{type(self).__name__}: give connection_string or account_url, not both"
            )

    def __repr__(self) -> str:
        where = self.account_url or ("connection string" if self.connection_string else "env")
        return f"{type(self).__name__}(queue_name={self.queue_name!r}, via={where!r})"

    def build(self) -> AzureQueueBackend:
        env_conn = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
        if self.account_url is not None:
            credential = self._credential()
            if credential is None and env_conn:
                client = QueueClient.from_connection_string(env_conn, self.queue_name)
            else:
                if credential is None:
                    credential = credentials.azure_default_credential(self.account_url)
                client = QueueClient(self.account_url, self.queue_name, credential=credential)
        else:
            conn = self.connection_string or env_conn
            if not conn:
                raise ConfigError(credentials.azure_no_connection_string(type(self).__name__))
            client = QueueClient.from_connection_string(conn, self.queue_name)
        return AzureQueueBackend(client)

    def _credential(self) -> Any:
        """A SAS token or account key from the environment, or None."""
        sas = os.environ.get("AZURE_STORAGE_SAS_TOKEN")
        if sas:
            return sas
        key = os.environ.get("AZURE_STORAGE_ACCOUNT_KEY")
        if not key:
            return None
        account = self.account_name
        if account is None:
            assert self.account_url is not None
            account = self.account_url.split("//", 1)[-1].split(".", 1)[0]
        return {"account_name": account, "account_key": key}
