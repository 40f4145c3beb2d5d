"""AzureQueueBackend: leasekeeper on Azure Storage Queue, through azure-storage-queue 12.x.

::

    from azure.storage.queue import QueueClient
    from leasekeeper import LeaseManager
    from leasekeeper.backends.azure import AzureQueueBackend

    client = QueueClient.from_connection_string(conn_str, "jobs")
    backend = AzureQueueBackend(client)
    with LeaseManager(backend, visibility_timeout=60) as manager:
        for held in manager.receive(max_messages=32, wait_seconds=20):
            with held:  # leased from the moment it arrived
                handle(held.message.body)

Or by URL: ``leasekeeper.connect("azure://<account>/jobs")``
(``leasekeeper.backends.schemes.azure``).
How Azure Storage Queue maps onto the backend contract (docs/backends/azure.md,
docs/backend-semantics.md):

- Every receive and every Update Message issues a **new** pop receipt and kills the
  previous one, so ``rotates_receipts`` is True and every successful extend or
  release answers ``Outcome("ok", receipt=<new>)``.
- There is no batch API: ``max_batch`` is 1 and the manager runs extends in
  parallel from its dispatch pool.
- ``extend``/``release`` call ``update_message(id, pop_receipt=..., visibility_timeout=n)``
  with the message **id** (a QueueMessage would make the SDK re-upload its
  content) and ``visibility_timeout`` **always** given (the SDK sends 0 when it is
  left out: the message would reappear at once).
- A message cannot outlive its ``expires_on`` (its time-to-live, 7 days by
  default: ``max_lease_age``). ``Message.hard_deadline`` is ``expires_on`` in local
  monotonic time less ``expiry_margin`` (2 s). Azure has no "beyond the expiry"
  error (it accepts such an update and deletes the message at its expiry anyway),
  so the backend refuses locally, as ``capped``, an extend that would pass a known
  expiry, and reports a ``MessageNotFound`` for a message whose expiry has passed
  as ``capped``.
- Azure has no long poll: ``receive(wait_seconds=...)`` re-polls with a backing-off
  pause (0.2 s doubling to 2 s) until a message arrives or ``wait_seconds`` runs out.
- A message carries no attributes (``carries_attributes`` is False).

Threads: a ``QueueClient`` sends through one azure-core ``RequestsTransport``,
which says of itself that it is not thread-safe. So extend, delete and release go
through a client per thread (``ThreadClients``), built from the given client's
URL, credential, API version, proxies, TLS verification and client certificate (or
by ``client_factory``), with the SDK's own retries off and short network timeouts.
The client you pass is used only for ``receive`` and ``send``, one request at a
time, so your message encode and decode policies and encryption settings apply.

Errors are mapped by ``classify_error`` on the service's error code. ``Outcome.detail``
never carries the service's message text: an error about the pop receipt quotes
it, and network errors quote the request URL, which carries ``popreceipt=``. The
urllib3 and azure-storage loggers log request URLs at DEBUG level, so the backend
installs a filter on them that blanks pop receipts and SAS signatures. A failed
receive or send raises ``AzureQueueError``, a ``ReceiveError``.
"""

from __future__ import annotations

import logging
import math
import random
import re
import threading
from collections.abc import Callable, Sequence
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
        "pip install 'azure-storage-queue>=12.8' (what leasekeeper's azure extra brings)"
    ) from _exc

from leasekeeper.backends.cloud import CloudBackend, ThreadClients
from leasekeeper.backends.contract import Handle, Message, Outcome, OutcomeKind, QueueCounts
from leasekeeper.backends.rebuild import (
    azure_renewal_problem,
    azure_secrets,
    azure_settings,
    azure_transport_options,
)
from leasekeeper.backends.shared import (
    SKEW_MARGIN,
    ErrorTable,
    check_lease_age,
    clean_code,
    epoch_seconds,
    redact,
    text_body,
    whole_seconds,
)
from leasekeeper.backends.spec import AzureQueueSpec, URLSpec
from leasekeeper.clock import SYSTEM_CLOCK, Clock, DrivenClock
from leasekeeper.errors import ReceiveError, ReceiveErrorKind

__all__ = [
    "AzureQueueBackend",
    "AzureQueueError",
    "AzureQueueSpec",
    "classify_error",
    "scrub",
]

log = logging.getLogger("leasekeeper.backends.azure")

MAX_BATCH = 1  # no batch update/delete in the Queue service
MAX_MESSAGES = 32  # per Get Messages call
MAX_VISIBILITY = 604800  # 7 days: per Update Message / Get Messages call
DEFAULT_TTL = 604800.0  # 7 days: a message's default time-to-live
DEFAULT_VISIBILITY = 30.0  # the service's default for Get Messages
DEFAULT_EXPIRY_MARGIN = 2.0
# Per-thread clients: fail fast rather than sit on a lease's remaining time.
#: Receives and counts make one attempt: a worker retries them itself (the SDK's
#: default retries waited a minute and a half for an endpoint that does not answer).
ONCE: dict[str, Any] = {"retry_total": 0}
DEFAULT_CONNECTION_TIMEOUT = 5.0
DEFAULT_READ_TIMEOUT = 15.0
# receive(wait_seconds=...) re-polls with this backoff (Azure has no long poll).
_POLL_FIRST = 0.2
_POLL_MAX = 2.0

# "bug": the service says the request leasekeeper built is malformed, not a lost lease.
ERRORS = ErrorTable(
    lost="MessageNotFound PopReceiptMismatch",
    retry="ServerBusy InternalError OperationTimedOut",
    fatal="""
    QueueNotFound QueueBeingDeleted QueueDisabled ResourceNotFound AccountIsDisabled
    AuthenticationFailed InvalidAuthenticationInfo AuthorizationFailure
    AuthorizationPermissionMismatch AuthorizationProtocolMismatch
    AuthorizationResourceTypeMismatch AuthorizationServiceMismatch
    AuthorizationSourceIPMismatch InsufficientAccountPermissions
    KeyVaultAccessTokenCannotBeAcquired KeyVaultEncryptionKeyNotFound
    """,
    bug="""
    OutOfRangeQueryParameterValue InvalidQueryParameterValue MissingRequiredQueryParameter
    UnsupportedQueryParameter InvalidUri InvalidInput InvalidHttpVerb InvalidHeaderValue
    MissingRequiredHeader UnsupportedHeader InvalidXmlDocument InvalidXmlNodeValue
    EmptyMetadataKey UnsupportedHttpVerb
    """,
)

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


def scrub(text: str, secrets: Sequence[str] = ()) -> str:
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
    return clean_code(getattr(code, "value", code))  # StorageErrorCode is a str-enum


def _status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    if status is None:
        status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) and not isinstance(status, bool) else None


def _parameter_of(exc: BaseException) -> str:
    """The name (never the value) of the query parameter the service rejected."""
    info = getattr(exc, "additional_info", None)
    if isinstance(info, dict):
        for key, value in info.items():
            if str(key).lower() == "queryparametername" and clean_code(value):
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
    known = ERRORS.kind(code) if code else None
    if known is not None:
        return known
    if isinstance(exc, ClientAuthenticationError) or status in (401, 403):
        return "fatal"
    if status is not None and (status >= 500 or status in (408, 429)):
        return "retry"
    if status == 404 or isinstance(exc, ResourceNotFoundError):
        # A message operation's 404 without a code we know: the message is gone.
        return "fatal" if code else "lost"
    if status is not None and 400 <= status < 500:
        return "fatal"
    return "retry"  # no status: the answer never arrived whole


class AzureQueueError(ReceiveError):
    """A receive or a send failed: Azure's ``ReceiveError``. ``kind`` is "retry"
    (transient) or "fatal"; ``detail`` the code.

    The text is built from the error code only: the SDK's own exception (whose
    text can quote URLs, SAS signatures included) is not chained.
    """

    def __init__(self, operation: str, kind: ReceiveErrorKind, detail: str) -> None:
        super().__init__(kind, detail, operation=operation, service="Azure queue")


class AzureQueueBackend(CloudBackend):
    """leasekeeper's backend for one Azure Storage queue.

    ``AzureQueueBackend(queue_client, *, clock=None, client_factory=None,
    expiry_margin=2.0, max_lease_age=None)``. ``queue_client`` is an
    ``azure.storage.queue.QueueClient``; it is used for ``receive`` and ``send`` (so
    its message encode and decode policies decide how bodies travel). Extends,
    deletes and releases go through one client per thread, made by
    ``client_factory()`` when given (use it to carry a transport of your own),
    otherwise from ``queue_client``'s URL, credential, API version, proxies, TLS
    verification and client certificate, with the SDK's retries off and short
    network timeouts. ``max_lease_age`` given:
    a cap counted from the receive as well as the message's expiry.

    ``receive`` takes up to 32 messages a call, hidden for ``visibility_timeout``
    (0 < T <= 604800 s, default 30, sent rounded up). ``extend`` is Update Message
    to ``ceil(timeout)``, ``release`` to ``floor(delay)`` (0: visible at once);
    ``send`` is Put Message, ``delay`` up to 7 days and no attributes.
    ``poison_queue()`` is the queue ``<name>-poison``, created if missing.
    """

    service = "Azure queue"
    receipt_name = "pop receipt"
    logger = log
    bad_argument_code = "OutOfRangeQueryParameterValue [visibilitytimeout]"
    min_receive_visibility = 1
    min_release = 0
    carries_attributes = False
    max_send_delay = float(MAX_VISIBILITY)

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
        max_lease_age: float | None = None,
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
        self.max_lease_age = check_lease_age(max_lease_age, DEFAULT_TTL)
        self._lease_age_given = max_lease_age is not None
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

    @property
    def account_url(self) -> str:
        """The account's queue endpoint (no SAS token)."""
        url = str(self.queue_client.url).split("?", 1)[0].rstrip("/")
        suffix = "/" + self.queue_name
        return url[: -len(suffix)] if url.endswith(suffix) else url

    def credentials_problem(self) -> str | None:
        """Why the renewer process could not renew as this backend does: clients from a
        ``client_factory`` (user code it cannot call), or a credential built in this
        process that cannot be sent or made the same there, or none given and none in
        the environment. None when it can."""
        if self._factory is not None:
            return (
                "the Azure queue's clients come from your client_factory, which another "
                "process cannot call: it would renew through clients of its own"
            )
        return azure_renewal_problem(self.queue_client, self.account_url)

    def secret_options(self) -> dict[str, Any]:
        """The account key or SAS token the queue client holds: to the renewer only."""
        return azure_secrets(self.queue_client)

    def spec(self) -> URLSpec:
        """This account and queue by URL, with the queue client's retries and
        timeouts; the credential from the other process's environment (see
        ``leasekeeper.backends.schemes.azure``)."""
        account_url = self.account_url
        default = f"https://{self.account_name}.queue.core.windows.net"
        return URLSpec.of(
            f"azure://{self.account_name}/{self.queue_name}",
            {
                "account_url": None if account_url == default else account_url,
                "max_lease_age": self.max_lease_age if self._lease_age_given else None,
                **azure_settings(self.queue_client),
            },
        )

    def sibling(self, name: str, *, create: bool = False) -> AzureQueueBackend:
        """The queue ``name`` of the same account, with the same credential, API
        version, message policies, proxies and TLS verification (``create``: Create
        Queue when it is missing)."""
        source = self.queue_client
        sas = str(source.url).partition("?")[2]  # a SAS token in the URL is the credential
        client = QueueClient.from_queue_url(
            f"{self.account_url}/{name}{'?' + sas if sas else ''}",
            credential=source.credential,
            api_version=source.api_version,
            # The SDK keeps them only in private fields: copied where they are found.
            message_encode_policy=getattr(source, "_message_encode_policy", None),
            message_decode_policy=getattr(source, "_message_decode_policy", None),
            **azure_transport_options(source),
        )
        if create:
            try:
                self.call("CreateQueue", client.create_queue)
            except AzureQueueError as exc:
                if not exc.detail.startswith("QueueAlreadyExists"):
                    raise
        return AzureQueueBackend(
            client,
            clock=self.clock,
            expiry_margin=self.expiry_margin,
            max_lease_age=self.max_lease_age if self._lease_age_given else None,
        )

    def poison_queue(self) -> AzureQueueBackend:
        """The queue ``<name>-poison`` (Azure's convention for failed messages, as
        Azure Functions uses it), created if missing."""
        return self.sibling(f"{self.queue_name}-poison", create=True)

    def __repr__(self) -> str:
        return f"AzureQueueBackend(account={self.account_name!r}, queue={self.queue_name!r})"

    # ------------------------------------------------------------------ clients

    def _new_client(self) -> QueueClient:
        if self._factory is not None:
            return self._factory()
        source = self.queue_client
        return QueueClient.from_queue_url(
            source.url,  # carries a SAS token, if that is the credential
            credential=source.credential,
            api_version=source.api_version,
            retry_total=0,
            connection_timeout=DEFAULT_CONNECTION_TIMEOUT,
            read_timeout=DEFAULT_READ_TIMEOUT,
            **azure_transport_options(source),  # its proxies and TLS verification
        )

    def close(self) -> None:
        """Close the per-thread clients this backend made and end any receive wait.

        The ``queue_client`` you passed in stays open: it is yours. Calls made after
        ``close()`` still work (through new clients), but ``receive`` no longer waits.
        """
        self._closed.set()
        self._clients.close()

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

    def hard_deadline_after(self, received_at: float) -> float | None:
        # The message's expiry is its cap; max_lease_age counts only when given.
        return super().hard_deadline_after(received_at) if self._lease_age_given else None

    # ------------------------------------------------------------------ receiving

    def receive_messages(self, count: int, wait: float, visibility: float | None) -> list[Message]:
        vis = DEFAULT_VISIBILITY if visibility is None else visibility
        sent = whole_seconds(vis, up=True)
        deadline = self.clock.now() + wait
        pause = _POLL_FIRST
        while True:
            received_at = self.clock.now()  # just before the request: rule 1
            page = self.call("receive", lambda: self._receive_page(count, sent))
            if page:
                offset = self.clock.wall() - self.clock.now()  # epoch - monotonic
                return [self._message(raw, received_at, vis, offset, 0.0) for raw in page]
            left = deadline - self.clock.now()
            if left <= 0 or self._driven or self._closed.is_set():
                return []
            self._closed.wait(min(pause * self._rng.uniform(0.8, 1.2), left))
            pause = min(pause * 2, _POLL_MAX)

    def _receive_page(self, count: int, visibility: int) -> list[QueueMessage]:
        with self._receive_lock:
            pager = self.queue_client.receive_messages(
                messages_per_page=count, max_messages=count, visibility_timeout=visibility, **ONCE
            )
            # One page is one Get Messages call; iterating further would poll again.
            page = next(iter(pager.by_page()), None)
            return [] if page is None else list(page)

    def queue_counts(self) -> QueueCounts:
        """The queue's approximate message count (Get Queue Metadata), as ``total``:
        Azure counts hidden messages too and says nothing of visible ones."""

        def read() -> object:
            with self._receive_lock:
                return self.queue_client.get_queue_properties(**ONCE).approximate_message_count

        total = self.call("counts", read)
        return QueueCounts(None, None, None, total if isinstance(total, int) else None)

    def new_receive_error(
        self, kind: ReceiveErrorKind, detail: str, operation: str, exc: BaseException
    ) -> AzureQueueError:
        return AzureQueueError(operation, kind, detail)

    def _message(
        self, raw: QueueMessage, received_at: float, vis: float, offset: float, margin: float
    ) -> Message:
        message_id = str(raw.id)
        visible_epoch = epoch_seconds(raw.next_visible_on)
        expires = epoch_seconds(raw.expires_on)
        message = self.new_message(
            id=message_id,
            receipt=raw.pop_receipt,
            body=text_body(raw.content, decode=False),
            raw=raw,
            received_at=received_at,
            visibility=vis,
            count=raw.dequeue_count,
            deadline_hint=None if visible_epoch is None else visible_epoch - offset - margin,
            hard_deadline=None if expires is None else expires - offset - self.expiry_margin,
        )
        self._remember_expiry(message_id, expires)
        return message

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
            visible_epoch = epoch_seconds(raw.next_visible_on)
            if visible_epoch is None:
                raise ValueError(
                    f"message {raw.id!r} has no next_visible_on: pass visibility_timeout"
                )
            vis = max(0.0, visible_epoch - offset - SKEW_MARGIN - now)
        else:
            vis = self.adopt_visibility(visibility_timeout)
        return self._message(raw, now, vis, offset, SKEW_MARGIN)

    # ------------------------------------------------------------------ producing

    def send_message(self, body: str | bytes, attributes: dict[str, str], delay: int) -> str:
        def put() -> Any:
            with self._receive_lock:  # the given client, one request at a time
                return self.queue_client.send_message(body, visibility_timeout=delay or None)

        return str(self.call("send", put).id)

    # ------------------------------------------------------------------ the manager's calls

    def send_extend(self, handles: Sequence[Handle], seconds: int) -> list[Outcome]:
        client = self._clients.get()
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
        client = self._clients.get()
        out: list[Outcome] = []
        for handle in handles:
            outcome = self._update(client, "release", handle, seconds)
            if outcome.kind in ("ok", "lost"):
                self._forget(handle.message_id)
            out.append(outcome)
        return out

    def send_delete(self, handles: Sequence[Handle]) -> list[Outcome]:
        client = self._clients.get()
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
