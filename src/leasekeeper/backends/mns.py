"""MNSBackend: leasekeeper on Aliyun MNS (Simple Message Queue), through aliyun-mns-sdk.

::

    from mns.account import Account
    from leasekeeper import LeaseManager
    from leasekeeper.backends.mns import MNSBackend

    queue = Account(endpoint, access_key_id, access_key_secret).get_queue("jobs")
    backend = MNSBackend(queue)
    with LeaseManager(backend, visibility_timeout=60) as manager:
        for held in manager.receive(max_messages=16, wait_seconds=20):
            with held:  # leased from the moment it arrived
                handle(held.message.body)

Or ``leasekeeper.connect("mns://<account-id>.mns.<region>.aliyuncs.com/jobs")``. How
MNS maps onto the backend contract (docs/backends/mns.md, docs/backend-semantics.md):

- Every receive and every ChangeMessageVisibility issues a **new** ReceiptHandle
  and kills the previous one: ``rotates_receipts`` is True.
- No batch ChangeMessageVisibility: ``max_batch`` is 1 and the manager spreads
  extends over its threads; a release is at least 1 s (MNS refuses 0).
- A receive cannot choose its visibility timeout: the queue's VisibilityTimeout
  applies (read once, or ``queue_visibility_timeout=``); another
  ``receive(visibility_timeout=T)`` costs one ChangeMessageVisibility per message.
- The service's NextVisibleTime may only shorten the local deadline. MNS documents
  no cap on the total invisibility: ``max_lease_age`` is ``math.inf`` (a message
  still disappears after the queue's MessageRetentionPeriod, counted from its send).
- Message attributes are MNS's user properties (sent as STRING ones).

Threads: one ``mns.account.Account`` holds a single HTTP connection shared by every
``Queue`` obtained from it, and two threads using it at once corrupt each other's
requests. So this backend never sends a request through the ``Queue`` you pass in:
every thread that calls it gets its own ``Account``/``Queue`` (``ThreadClients``),
built like it, without the SDK's logger (it logs receipt handles), with a 10 s
socket timeout per call (a receive's: ``wait_seconds + 10`` s). Errors: ``classify_error``.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

try:
    from mns.account import Account
    from mns.auth import StaticCredentialsProvider
    from mns.message_property import MessagePropertyValue
    from mns.mns_exception import (
        MNSClientNetworkException,
        MNSClientParameterException,
        MNSExceptionBase,
        MNSServerException,
    )
    from mns.mns_request import GetQueueAttributesRequest, GetQueueAttributesResponse
    from mns.queue import Message as MNSMessage
    from mns.queue import Queue as MNSQueue
    from mns.queue import QueueMeta
except ImportError as _exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "leasekeeper.backends.mns needs aliyun-mns-sdk, which is not installed: "
        "pip install 'aliyun-mns-sdk>=1.3' (what leasekeeper's mns extra brings)"
    ) from _exc

from leasekeeper.backends.cloud import CloudBackend, ReadOnce, ThreadClients
from leasekeeper.backends.contract import Handle, Message, Outcome, OutcomeKind, QueueCounts
from leasekeeper.backends.rebuild import mns_renewal_problem, mns_secrets
from leasekeeper.backends.shared import (
    REDACTED,
    SKEW_MARGIN,
    ErrorTable,
    check_lease_age,
    clean_code,
    codes,
    epoch_seconds,
    is_seconds,
    redact,
    text_body,
    whole_seconds,
)
from leasekeeper.backends.spec import MNSSpec, URLSpec
from leasekeeper.clock import SYSTEM_CLOCK, Clock
from leasekeeper.errors import ReceiveError, ReceiveErrorKind

__all__ = ["MNSBackend", "MNSQueueError", "MNSSpec", "classify_error", "scrub"]

log = logging.getLogger("leasekeeper.backends.mns")

MAX_BATCH = 1  # no batch ChangeMessageVisibility: spread extends over the pool
MAX_DELETE_BATCH = 16  # BatchDeleteMessage
MAX_RECEIVE = 16  # BatchReceiveMessage
MAX_WAIT_SECONDS = 30  # long poll
MAX_VISIBILITY = 43200  # ChangeMessageVisibility and the queue's VisibilityTimeout
MAX_DELAY = 604800  # SendMessage's DelaySeconds
MIN_VISIBILITY = 1  # ChangeMessageVisibility refuses 0
# Socket timeout of a per-thread client for one extend/delete/release/attribute
# call; a receive gets its long-poll wait on top.
CALL_TIMEOUT = 10.0

AUTH_CODES = codes(
    """
    AccessDenied InvalidAccessKeyId SignatureDoesNotMatch InvalidAuthorizationHeader
    MissingAuthorizationHeader InvalidSecurityToken SecurityTokenExpired
    InvalidSecurityTokenExpired Forbidden
    """
)  # the STS token codes as other Aliyun services name them (not in MNS's code list)
QUEUE_GONE_CODES = codes("QueueNotExist QueueDeletedRecently")
# The service says a request leasekeeper built is malformed: a bug, not a lost lease.
BUG_CODES = codes(
    """
    InvalidArgument InvalidQueryString InvalidRequestURL MalformedXML InvalidDegist
    InvalidDateHeader MissingDateHeader MissingReceiptHandle MissingVisibilityTimeout
    InvalidQueueName QueueNameLengthError
    """
)  # InvalidDegist: sic, the service's spelling
ERRORS = ErrorTable(
    lost="MessageNotExist ReceiptHandleError",
    # TimeExpired: the request arrived too late (408): a slow network, or skew
    retry="""
    InternalError InternalServerError ServiceUnavailable ServiceBusy QpsLimitExceeded
    TimeExpired RequestTimeout
    """,
    fatal=AUTH_CODES | QUEUE_GONE_CODES,
    bug=BUG_CODES,
)

# A receipt handle (or anything like one) in free text: a token of 16+ base64/URL
# characters with a digit in it. Error codes and English words have no digits.
_TOKEN = re.compile(r"(?=[A-Za-z0-9+/=_%.-]*[0-9])[A-Za-z0-9+/=_%.-]{16,}")
_HANDLE_FIELD = re.compile(r"(?i)(receipt_?handle['\"]?\s*(?:=|:|>)\s*['\"]?)[^&\s'\"<,;)]*")
_REDACTIONS = ((_HANDLE_FIELD, r"\1" + REDACTED), (_TOKEN, REDACTED))
_MAX_TEXT = 300


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with the given secrets and anything handle-like blanked out, shortened."""
    text = redact(text, secrets, _REDACTIONS)
    text = " ".join(text.split())  # no multi-line XML dumps in one log line
    return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 3] + "..."


def _code_of(exc: BaseException) -> str:
    return clean_code(getattr(exc, "type", None)) or "UnknownError"


def _kind_of_code(code: str) -> OutcomeKind:
    # RETRY_CODES, and codes we do not know: keep trying while the lease has time;
    # a persistent error turns into "lost" at the lease's deadline.
    return ERRORS.kind(code) or "retry"


def _detail_of_code(code: str, message: Any, secrets: Iterable[str]) -> str:
    if code in BUG_CODES:
        text = scrub(message, secrets) if isinstance(message, str) else ""
        said = f" ({text})" if text else ""
        return f"{code}: the service rejected a request leasekeeper built{said}"
    if code in AUTH_CODES:
        return f"{code}: the credentials were refused"
    if code in QUEUE_GONE_CODES:
        return f"{code}: the queue does not exist"
    return code


def classify_error(exc: BaseException, secrets: Iterable[str] = ()) -> tuple[OutcomeKind, str]:
    """Map an exception from the SDK to an outcome kind and a detail.

    The detail names the error code (or the exception type), never the text of a
    receipt handle: for malformed-request codes it adds the service's message
    with ``secrets`` and anything handle-like blanked out. By ``ERRORS``; the SDK's
    own parameter check is "fatal", network errors and unknown codes "retry"
    (docs/backends/mns.md has the table).
    """
    if isinstance(exc, MNSServerException):
        code = _code_of(exc)
        return _kind_of_code(code), _detail_of_code(code, getattr(exc, "message", ""), secrets)
    if isinstance(exc, MNSClientNetworkException):
        # NetWorkException (connection refused/reset, timeout), RespDataDamaged (an
        # answer cut short or garbled), UnkownError (sic: an unexpected status).
        return "retry", _code_of(exc)
    if isinstance(exc, MNSClientParameterException):
        return "fatal", f"{_code_of(exc)}: the SDK refused a request leasekeeper built"
    if isinstance(exc, MNSExceptionBase):
        return "retry", _code_of(exc)
    if isinstance(exc, OSError):
        return "retry", type(exc).__name__
    return "retry", f"unexpected {type(exc).__name__}"


class MNSQueueError(ReceiveError):
    """A receive, a send or a queue read failed: MNS's ``ReceiveError``.

    ``kind`` is "retry" (transient) or "fatal"; ``detail`` the error code. The
    text is built from the code only: the SDK's exception is not chained (its
    text can quote a whole response, receipt handles included).
    """

    def __init__(
        self, operation: str, kind: ReceiveErrorKind, detail: str, request_id: str = ""
    ) -> None:
        where = f" [request id {request_id}]" if request_id else ""
        super().__init__(kind, f"{detail}{where}", operation=operation, service="MNS")
        self.detail = detail
        self.request_id = request_id


def _request_id(exc: BaseException) -> str:
    return clean_code(getattr(exc, "req_id", None))


def _set_timeout(queue: Any, seconds: float) -> None:
    """Set the socket timeout of a per-thread client's one connection.

    The SDK fixes it at connect time (60 s for http, none at all for https): a
    stalled connection would hold a dispatch thread far past a lease's deadline.
    """
    http = queue.mns_client.http
    http.connection_timeout = seconds
    conn = http.conn
    conn.timeout = seconds  # HTTPSConnection.connect
    if hasattr(conn, "connection_timeout"):
        conn.connection_timeout = seconds  # MNSHTTPConnection.connect
    sock = getattr(conn, "sock", None)
    if sock is not None:
        sock.settimeout(seconds)


class _Connection:
    """One thread's own SDK Queue (and the one connection under it)."""

    __slots__ = ("__weakref__", "queue", "timeout")

    def __init__(self, queue: Any) -> None:
        self.queue = queue
        self.timeout = -1.0  # the socket timeout last set


class _QueueFactory:
    """Makes SDK Queues like the one given: same endpoint, credentials, encoding."""

    def __init__(self, queue: Any) -> None:
        client = queue.mns_client
        scheme = "https" if getattr(client, "is_https", False) else "http"
        self.endpoint = f"{scheme}://{client.host}"
        self._provider: Any = client.credentials_provider
        self._encoding = bool(getattr(queue, "encoding", True))
        self._keep_alive = bool(getattr(client.http, "keep_alive", True))
        self._version: str = str(getattr(client, "version", "2015-06-06"))

    def credentials_provider(self) -> Any:
        """A provider for a new client: a copy of a static one, else the same object.

        A custom provider (STS refresh, alibabacloud_credentials) is shared, so its
        refreshed tokens reach every thread; such providers must be thread-safe.
        """
        provider = self._provider
        if type(provider) is StaticCredentialsProvider:
            creds = provider.get_credentials()
            return StaticCredentialsProvider(
                creds.get_access_key_id(),
                creds.get_access_key_secret(),
                creds.get_security_token() or "",
            )
        return provider

    def new_queue(self, name: str) -> Any:
        """A new Account and Queue for the calling thread (never shared)."""
        account = Account(self.endpoint, credentials_provider=self.credentials_provider())
        client = account.mns_client
        client.version = self._version
        client.http.set_keep_alive(self._keep_alive)
        queue = account.get_queue(name)
        queue.set_encoding(self._encoding)
        return queue


def _attributes(raw: Any) -> dict[str, str]:
    """An SDK message's user properties (MessagePropertyValue objects), as text."""
    found = getattr(raw, "user_properties", None)
    return {
        str(name): str(value.get_string_value_by_type())
        for name, value in (found.items() if isinstance(found, Mapping) else ())
        if hasattr(value, "get_string_value_by_type")
    }


class MNSBackend(CloudBackend):
    """leasekeeper's backend for one MNS queue.

    ``queue`` is an ``mns.queue.Queue`` (``Account(...).get_queue(name)``): the
    backend copies its endpoint, credentials provider and encoding and never sends
    a request through it. ``queue_visibility_timeout`` is the queue's
    VisibilityTimeout, if you know it: otherwise it is read once when first needed
    (``refresh_queue_attributes()`` reads it again).

    ``receive`` is BatchReceiveMessage (16 a call, a long poll up to 30 s rounded
    up); ``extend`` and ``release`` are ChangeMessageVisibility (a new receipt each);
    ``delete`` is DeleteMessage, or BatchDeleteMessage (16 a call) for several;
    ``send`` is SendMessage (``delay`` up to 7 days). A failed receive, send or
    attribute read raises ``MNSQueueError`` (an empty queue is ``[]``).
    """

    service = "MNS"
    receipt_name = "receipt handle"
    logger = log
    bad_argument_code = "InvalidArgument"
    min_receive_visibility = MIN_VISIBILITY  # the change after a receive refuses 0
    min_release = MIN_VISIBILITY  # ChangeMessageVisibility refuses 0
    carries_attributes = True
    max_send_delay = float(MAX_DELAY)

    max_batch = MAX_BATCH
    max_visibility = float(MAX_VISIBILITY)
    rotates_receipts = True
    max_receive = MAX_RECEIVE  # messages per BatchReceiveMessage
    max_wait_seconds = float(MAX_WAIT_SECONDS)  # longest long poll

    def __init__(
        self,
        queue: Any,
        *,
        clock: Clock | None = None,
        queue_visibility_timeout: float | None = None,
        max_lease_age: float | None = None,
    ) -> None:
        if not isinstance(queue, MNSQueue):
            raise TypeError(
                "MNSBackend takes an mns.queue.Queue (Account(...).get_queue(name)), got "
                f"{type(queue).__module__}.{type(queue).__qualname__}"
            )
        client = queue.mns_client
        host = getattr(client, "host", None)
        if not isinstance(host, str) or not host:
            raise ValueError("the queue's MNS client has no host")
        if queue_visibility_timeout is not None and not (
            is_seconds(queue_visibility_timeout)
            and MIN_VISIBILITY <= queue_visibility_timeout <= MAX_VISIBILITY
        ):
            raise ValueError(
                f"queue_visibility_timeout must be between {MIN_VISIBILITY} and "
                f"{MAX_VISIBILITY} seconds, got {queue_visibility_timeout!r}"
            )
        self.queue_name: str = str(queue.queue_name)
        self.host: str = host
        self._factory = _QueueFactory(queue)
        self.endpoint: str = self._factory.endpoint
        self._provider: Any = client.credentials_provider
        self.clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self.max_lease_age = check_lease_age(max_lease_age, math.inf)
        self._clients = ThreadClients(
            lambda: _Connection(self._new_queue()), _close_connection, log
        )
        self._given_vt = queue_visibility_timeout
        self._queue_vt = ReadOnce(
            self._read_visibility,
            None if queue_visibility_timeout is None else float(queue_visibility_timeout),
        )
        self._skew_warned = False

    def credentials_problem(self) -> str | None:
        return mns_renewal_problem(self._provider)

    def secret_options(self) -> dict[str, Any]:  # keys given in code: to the renewer only
        return mns_secrets(self._provider)

    def spec(self) -> URLSpec:
        """This endpoint and queue by URL (credentials: ``schemes.mns``)."""
        return URLSpec.of(
            f"mns://{self.host}/{self.queue_name}",
            {
                "secure": None if self.endpoint.startswith("https") else False,
                "queue_visibility_timeout": self._given_vt,
                "max_lease_age": None if self.max_lease_age == math.inf else self.max_lease_age,
            },
        )

    def sibling(self, name: str, *, create: bool = False) -> MNSBackend:
        """The queue ``name`` of the same endpoint, with the same credentials (with
        ``create``, CreateQueue first: a queue that exists is kept as it is)."""
        queue = self._factory.new_queue(name)
        if create:
            try:
                self.call("CreateQueue", lambda: queue.create(QueueMeta()))
            except MNSQueueError as exc:
                if not exc.detail.startswith("QueueAlreadyExist"):
                    raise
        return MNSBackend(queue, clock=self.clock, max_lease_age=self.max_lease_age)

    def __repr__(self) -> str:
        return f"MNSBackend(host={self.host!r}, queue={self.queue_name!r})"

    # ------------------------------------------------------------------ clients

    def _new_queue(self) -> Any:
        return self._factory.new_queue(self.queue_name)

    def _queue(self, timeout: float = CALL_TIMEOUT) -> Any:
        """This thread's own Queue (a new one after a fork: sockets are not shared)."""
        connection = self._clients.get()
        if connection.timeout != timeout:
            try:
                _set_timeout(connection.queue, timeout)
                connection.timeout = timeout
            except Exception as exc:  # an SDK whose internals moved: keep its defaults
                log.debug("could not set the MNS client's timeout: %s", type(exc).__name__)
        return connection.queue

    def close(self) -> None:
        """Close the per-thread clients (a later call makes new ones); not your Queue."""
        self._clients.close()

    def _secrets(self, handles: Iterable[str] = ()) -> list[str]:
        """What ``scrub`` must blank out of an error's text: these handles and the key."""
        secrets = [h for h in handles if h]
        provider = self._provider
        if type(provider) is StaticCredentialsProvider:  # a custom one may refresh: no call
            key = provider.get_credentials().get_access_key_secret()
            if isinstance(key, str) and key:
                secrets.append(key)
        return secrets

    # ------------------------------------------------------------------ queue attributes

    def queue_visibility_timeout(self) -> float:
        """The queue's VisibilityTimeout in seconds: read once, then cached.
        Raises ``MNSQueueError`` when GetQueueAttributes fails (the RAM policy needs
        ``mns:GetQueueAttributes``, or pass ``queue_visibility_timeout=``)."""
        return self._queue_vt.get()

    def _attributes(self, operation: str) -> GetQueueAttributesResponse:
        request, response = GetQueueAttributesRequest(self.queue_name), GetQueueAttributesResponse()
        client = self._queue().mns_client
        # The client call, not Queue.get_attributes(): that one fills deprecated
        # QueueMeta fields and warns about each.
        self.call(operation, lambda: client.get_queue_attributes(request, response))
        return response

    def _read_visibility(self) -> float:
        seconds = self._attributes("GetQueueAttributes").visibility_timeout
        if not is_seconds(seconds) or not MIN_VISIBILITY <= seconds <= MAX_VISIBILITY:
            raise MNSQueueError(
                "GetQueueAttributes", "retry", f"unexpected VisibilityTimeout {seconds!r}"
            )
        return float(seconds)

    def queue_counts(self) -> QueueCounts:
        """ActiveMessages, InactiveMessages and DelayMessages (GetQueueAttributes)."""
        found = self._attributes("counts")
        counts = (found.active_messages, found.inactive_messages, found.delay_messages)
        return QueueCounts(*(n if isinstance(n, int) and n >= 0 else None for n in counts))

    def refresh_queue_attributes(self) -> float:
        """Forget the cached VisibilityTimeout and read it again."""
        self._queue_vt.forget()
        return self.queue_visibility_timeout()

    # ------------------------------------------------------------------ receiving

    def receive_messages(self, count: int, wait: float, visibility: float | None) -> list[Message]:
        poll = whole_seconds(wait, up=True)
        queue_vt = self.queue_visibility_timeout()  # before receiving: never strand messages
        queue = self._queue(CALL_TIMEOUT + poll)
        received_at = self.clock.now()  # just before the request: rule 1
        raws = self.call("receive", lambda: _receive_raw(queue, count, poll))
        if not raws:
            return []
        offset = self.clock.wall() - self.clock.now()  # epoch - monotonic, read together
        if visibility is None or whole_seconds(visibility, up=True) == int(queue_vt):
            asked = queue_vt if visibility is None else visibility
            return [self._received(raw, received_at, min(asked, queue_vt), offset) for raw in raws]
        return self._rehide(raws, received_at, visibility, queue_vt, offset)

    def new_receive_error(
        self, kind: ReceiveErrorKind, detail: str, operation: str, exc: BaseException
    ) -> MNSQueueError:
        if operation == "GetQueueAttributes" and detail.split(":", 1)[0] in AUTH_CODES:
            detail += (
                " (reading the queue's VisibilityTimeout needs mns:GetQueueAttributes; "
                "or pass MNSBackend(queue, queue_visibility_timeout=...))"
            )
        return MNSQueueError(operation, kind, detail, _request_id(exc))

    def _rehide(
        self, raws: list[Any], received_at: float, asked: float, queue_vt: float, offset: float
    ) -> list[Message]:
        """Change each message's invisibility to ``asked`` (receive cannot choose it):
        one that is lost meanwhile is skipped, one that fails otherwise keeps the
        queue's timeout."""
        seconds = max(MIN_VISIBILITY, whole_seconds(asked, up=True))
        queue = self._queue()
        out: list[Message] = []
        for raw in raws:
            receipt = raw.receipt_handle
            try:
                answer = queue.change_message_visibility(receipt, seconds)
            except Exception as exc:
                kind, detail = classify_error(exc, self._secrets([receipt]))
                keep = kind != "lost"
                log.warning(
                    "message %r: the change to the asked visibility_timeout failed (%s: %s); %s",
                    str(raw.message_id),
                    kind,
                    detail,
                    f"it keeps the queue's {queue_vt:g}s" if keep else "skipped",
                )
                if keep:
                    out.append(self._received(raw, received_at, min(asked, queue_vt), offset))
                continue
            # raw now describes the message as it is: newest handle, new deadline.
            # received_at stays the time before the receive: earlier than the change,
            # so received_at + asked is never later than the service's deadline.
            raw.receipt_handle = getattr(answer, "receipt_handle", None)
            if not isinstance(raw.receipt_handle, str) or not raw.receipt_handle:
                log.warning("message %r: no receipt handle in the answer; skipped", raw.message_id)
                continue
            next_visible = epoch_seconds(getattr(answer, "next_visible_time", None))
            if next_visible is not None:
                raw.next_visible_time = round(next_visible * 1000)
            out.append(self._received(raw, received_at, asked, offset))
        return out

    def _received(self, raw: Any, received_at: float, vis: float, offset: float) -> Message:
        hint = _hint(raw, offset, margin=0.0)
        if hint is not None and hint < received_at:
            # The service hid the message after this request was sent, for at least
            # a second: a hint before the request is the clocks disagreeing.
            if not self._skew_warned:
                self._skew_warned = True
                log.warning(
                    "MNS NextVisibleTime lies %.1fs before the receive request was sent: the "
                    "local clock is ahead of the service's; ignoring NextVisibleTime",
                    received_at - hint,
                )
            hint = None
        return self._message(raw, received_at, vis, hint)

    def _message(self, raw: Any, received_at: float, vis: float, hint: float | None) -> Message:
        return self.new_message(
            id=raw.message_id,
            receipt=raw.receipt_handle,
            body=text_body(raw.message_body, decode=True),
            raw=raw,
            received_at=received_at,
            visibility=vis,
            count=raw.dequeue_count,
            attributes=_attributes(raw),
            deadline_hint=hint,
        )

    def adopt(self, raw: Any, visibility_timeout: float | None = None) -> Message:
        """Turn an ``mns.queue.Message`` you received yourself into a Message to register.

        When it was received is not known here, so the local estimate counts
        ``visibility_timeout`` (default: the queue's VisibilityTimeout) from now,
        and the message's ``next_visible_time`` (the service's clock, less 0.5 s
        for skew) may only shorten it.
        """
        if not isinstance(raw, MNSMessage):
            raise TypeError(
                f"MNSBackend.adopt() takes an mns.queue.Message, got {type(raw).__name__}"
            )
        if visibility_timeout is None:
            vis = self.queue_visibility_timeout()
        else:
            vis = self.adopt_visibility(visibility_timeout)
        now = self.clock.now()
        offset = self.clock.wall() - now
        return self._message(raw, now, vis, _hint(raw, offset, margin=SKEW_MARGIN))

    # ------------------------------------------------------------------ producing

    def send_message(self, body: str | bytes, attributes: dict[str, str], delay: int) -> str:
        if isinstance(body, bytes):
            body = body.decode("utf-8")  # the SDK sends text; not UTF-8: ValueError
        message = MNSMessage(body, delay_seconds=delay)
        for name, value in attributes.items():
            message.add_user_property(name, MessagePropertyValue.create_string(value))
        queue = self._queue()
        sent = self.call("send", lambda: queue.send_message(message))
        return str(sent.message_id)

    # ------------------------------------------------------------------ the manager's calls

    def send_extend(self, handles: Sequence[Handle], seconds: int) -> list[Outcome]:
        return self.per_entry("extend", handles, lambda handle: self._change(handle, seconds))

    def send_release(self, handles: Sequence[Handle], seconds: int) -> list[Outcome]:
        return self.per_entry("release", handles, lambda handle: self._change(handle, seconds))

    def _change(self, handle: Handle, seconds: int) -> Outcome:
        answer = self._queue().change_message_visibility(handle.receipt, seconds)
        receipt = getattr(answer, "receipt_handle", None)
        if not isinstance(receipt, str) or not receipt:
            # The old receipt is dead and the new one is unknown: the lease is gone.
            return Outcome("lost", detail="no ReceiptHandle in the ChangeVisibility answer")
        return Outcome("ok", receipt=receipt)

    def send_delete(self, handles: Sequence[Handle]) -> list[Outcome]:
        out: list[Outcome] = []
        for start in range(0, len(handles), MAX_DELETE_BATCH):
            batch = handles[start : start + MAX_DELETE_BATCH]
            out.extend(self.whole_call("delete", batch, self._delete))
        return out

    def _delete(self, handles: Sequence[Handle]) -> list[Outcome]:
        """DeleteMessage for one handle, BatchDeleteMessage for several: raises what
        the SDK raises, but a batch that failed entry by entry answers per entry."""
        queue = self._queue()
        if len(handles) == 1:
            queue.delete_message(handles[0].receipt)
            return [Outcome("ok")]
        try:
            queue.batch_delete_message([h.receipt for h in handles])
        except MNSServerException as exc:
            sub_errors = getattr(exc, "sub_errors", None)
            if isinstance(sub_errors, list) and sub_errors:
                return self._batch_outcomes(handles, sub_errors, exc)
            raise
        return [Outcome("ok") for _ in handles]

    def _batch_outcomes(
        self, handles: Sequence[Handle], sub_errors: list[Any], exc: BaseException
    ) -> list[Outcome]:
        """Per-entry outcomes of a partly failed BatchDeleteMessage (matched by handle)."""
        failed: dict[str, str] = {}
        for entry in sub_errors:
            if isinstance(entry, dict) and isinstance(entry.get("ReceiptHandle"), str):
                failed[entry["ReceiptHandle"]] = (
                    clean_code(entry.get("ErrorCode")) or "UnknownError"
                )
        secrets = self._secrets(h.receipt for h in handles)
        note = self.failure_note(exc, ())
        out: list[Outcome] = []
        for handle in handles:
            code = failed.pop(handle.receipt, None)
            if code is None:
                out.append(Outcome("ok"))
                continue
            outcome = Outcome(_kind_of_code(code), detail=_detail_of_code(code, "", secrets))
            self.log_failure("delete", [handle], outcome, note)
            out.append(outcome)
        if failed:
            log.warning(
                "BatchDeleteMessage on %r reported %d error(s) for handles it was not sent",
                self,
                len(failed),
            )
        return out

    # ------------------------------------------------------------------ errors

    def classify(self, exc: BaseException, receipts: Sequence[str] = ()) -> Outcome:
        """``classify_error``, with ``receipts`` and the access key blanked out."""
        kind, detail = classify_error(exc, self._secrets(receipts))
        return Outcome(kind, detail=detail)

    def failure_note(self, exc: BaseException, receipts: Sequence[str]) -> str:
        request_id = _request_id(exc)
        return f"request id {request_id}" if request_id else ""


def _receive_raw(queue: Any, count: int, wait: int) -> list[Any]:
    try:
        return list(queue.batch_receive_message(count, wait))
    except MNSServerException as exc:
        if _code_of(exc) == "MessageNotExist":
            return []  # on receive, MessageNotExist means "no message"
        raise


def _hint(raw: Any, offset: float, margin: float) -> float | None:
    """The message's NextVisibleTime as local monotonic time, less ``margin``."""
    epoch = epoch_seconds(getattr(raw, "next_visible_time", None))
    return None if epoch is None else epoch - offset - margin


def _close_connection(connection: _Connection) -> None:
    connection.queue.mns_client.close_connection()
