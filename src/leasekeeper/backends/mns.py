"""MNSBackend: leasekeeper on Aliyun MNS (Simple Message Queue), through aliyun-mns-sdk.

::

    from mns.account import Account
    from leasekeeper import LeaseManager
    from leasekeeper.backends.mns import MNSBackend

    queue = Account(endpoint, access_key_id, access_key_secret).get_queue("jobs")
    backend = MNSBackend(queue)
    with LeaseManager(backend, visibility_timeout=60) as manager:
        for message in backend.receive(max_messages=16, wait_seconds=20):
            with manager.lease(message):
                handle(message.body)

How MNS maps onto the backend contract (see docs/backends/mns.md):

- Every receive and every ChangeMessageVisibility issues a **new** ReceiptHandle
  and kills the previous one, so ``rotates_receipts`` is True and every
  successful extend or release answers ``Outcome("ok", receipt=<new>)``.
- MNS has no batch ChangeMessageVisibility. The manager hands each chunk of
  ``max_batch`` due leases to *one* pool thread, which would extend them one
  after another; so ``max_batch`` is 1 and the manager spreads extends over its
  ``max_concurrency`` threads. ``delete`` still uses BatchDeleteMessage (up to
  16 handles a call) when it is given several handles; with one handle it uses
  DeleteMessage.
- ChangeMessageVisibility takes whole seconds, 1 to 43200. Extends round **up**
  (the manager counts its deadline from the float it asked for, so a longer real
  invisibility is the safe side), and so does a receive's long poll (0.5 s is a
  1 s poll). A release cannot ask for 0 seconds: release
  delays round **down** to whole seconds, but to at least **1 s**, so
  ``release(delay=0)`` makes the message visible again after one second.
- A receive cannot choose its visibility timeout: the queue's VisibilityTimeout
  applies. The backend reads it once (GetQueueAttributes), or takes it from
  ``queue_visibility_timeout=``. When ``receive(visibility_timeout=T)`` asks for
  another value, each received message gets a ChangeMessageVisibility to ``T``
  right away (and its new handle); if that call fails the message keeps the
  queue's timeout and the local deadline says so. Give the queue the same
  VisibilityTimeout as ``LeaseConfig.visibility_timeout`` to save those calls.
- ``received_at`` is read just before the request; the service's
  NextVisibleTime (epoch ms) may only shorten the local deadline (a hint that
  lies before the request was even sent is clock skew and is ignored, with a
  warning). MNS documents no limit on the total invisibility, so
  ``hard_deadline`` is None.

Threads: one ``mns.account.Account`` holds a single HTTP connection shared by
every ``Queue`` obtained from it, and two threads using it at once corrupt each
other's requests. So this backend never sends a request through the ``Queue``
you pass in (not even receive): it reads that queue's name, endpoint, credentials
provider and body encoding once, and every thread that calls the backend (the
manager's dispatch threads, handler threads, your receive loop) gets its own
``Account``/``Queue`` from a ``threading.local``, created on first use (and again
after a fork, and after ``close()``; see ``leasekeeper.backends.base.ThreadClients``).
Your ``Queue`` stays yours, to use from your own thread. The
per-thread clients are built without the SDK's logger (it logs receipt handles)
and with a 10 s socket timeout per call (``wait_seconds + 10`` s for a receive).

Errors are mapped by ``classify_error`` on the MNS error code: MessageNotExist
and ReceiptHandleError are "lost" (on receive, MessageNotExist means "no
message"); QueueNotExist, authentication errors and malformed-request errors
(InvalidArgument: a bug) are "fatal"; InternalError, ServiceUnavailable,
QpsLimitExceeded and network errors are "retry". ``Outcome.detail`` is the error
code; only for a malformed-request error does it add the service's message, with
anything handle-like blanked out. A failed receive raises ``MNSQueueError``, a
``leasekeeper.errors.ReceiveError``.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

try:
    from mns.account import Account
    from mns.auth import StaticCredentialsProvider
    from mns.mns_exception import (
        MNSClientNetworkException,
        MNSClientParameterException,
        MNSExceptionBase,
        MNSServerException,
    )
    from mns.mns_request import GetQueueAttributesRequest, GetQueueAttributesResponse
    from mns.queue import Message as MNSMessage
    from mns.queue import Queue as MNSQueue
except ImportError as _exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "leasekeeper.backends.mns needs aliyun-mns-sdk, which is not installed: "
        "pip install 'leasekeeper[mns]'"
    ) from _exc

from leasekeeper.backends.base import (
    REDACTED,
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
from leasekeeper.clock import SYSTEM_CLOCK, Clock
from leasekeeper.errors import ConfigError, ReceiveError, ReceiveErrorKind

__all__ = ["MNSBackend", "MNSQueueError", "classify_error", "scrub"]

log = logging.getLogger("leasekeeper.backends.mns")

MAX_BATCH = 1  # no batch ChangeMessageVisibility: spread extends over the pool
MAX_DELETE_BATCH = 16  # BatchDeleteMessage
MAX_RECEIVE = 16  # BatchReceiveMessage
MAX_WAIT_SECONDS = 30  # long poll
MAX_VISIBILITY = 43200  # ChangeMessageVisibility and the queue's VisibilityTimeout
MIN_VISIBILITY = 1  # ChangeMessageVisibility refuses 0
# Socket timeout of a per-thread client for one extend/delete/release/attribute
# call; a receive gets its long-poll wait on top.
CALL_TIMEOUT = 10.0
# adopt() trusts the service's clock for next_visible_time; allow this much skew.
ADOPT_SKEW_MARGIN = 0.5

LOST_CODES = frozenset({"MessageNotExist", "ReceiptHandleError"})
RETRY_CODES = frozenset(
    {
        "InternalError",
        "InternalServerError",
        "ServiceUnavailable",
        "ServiceBusy",
        "QpsLimitExceeded",
        "TimeExpired",  # the request arrived too late (408): a slow network, or skew
        "RequestTimeout",
    }
)
AUTH_CODES = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidAuthorizationHeader",
        "MissingAuthorizationHeader",
        # STS token codes as other Aliyun services name them (not in MNS's code list).
        "InvalidSecurityToken",
        "SecurityTokenExpired",
        "InvalidSecurityTokenExpired",
        "Forbidden",
    }
)
QUEUE_GONE_CODES = frozenset({"QueueNotExist", "QueueDeletedRecently"})
# The service says a request leasekeeper built is malformed: a bug, not a lost lease.
BUG_CODES = frozenset(
    {
        "InvalidArgument",
        "InvalidQueryString",
        "InvalidRequestURL",
        "MalformedXML",
        "InvalidDegist",  # sic: the service's spelling
        "InvalidDateHeader",
        "MissingDateHeader",
        "MissingReceiptHandle",
        "MissingVisibilityTimeout",
        "InvalidQueueName",
        "QueueNameLengthError",
    }
)
FATAL_CODES = AUTH_CODES | QUEUE_GONE_CODES | BUG_CODES
ERRORS = ErrorTable(
    lost=LOST_CODES, retry=RETRY_CODES, fatal=AUTH_CODES | QUEUE_GONE_CODES, bug=BUG_CODES
)

_CODE_SHAPE = re.compile(r"[A-Za-z0-9._-]{1,100}")
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
    code = getattr(exc, "type", None)
    if isinstance(code, str) and _CODE_SHAPE.fullmatch(code):
        return code
    return "UnknownError"


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
    with ``secrets`` and anything handle-like blanked out.

    - lost: MessageNotExist, ReceiptHandleError;
    - fatal: QueueNotExist; AccessDenied, InvalidAccessKeyId,
      SignatureDoesNotMatch and the other authentication codes; InvalidArgument
      and the other malformed-request codes (a bug); the SDK's own parameter
      check (``MNSClientParameterException``);
    - retry: InternalError, ServiceUnavailable, QpsLimitExceeded, TimeExpired and
      unknown codes; ``MNSClientNetworkException`` (connection errors, timeouts,
      a damaged answer); OSError and anything unexpected.
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
    """A receive (or the queue-attribute read it needs) failed: MNS's ``ReceiveError``.

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
    rid = getattr(exc, "req_id", None)
    return rid if isinstance(rid, str) and _CODE_SHAPE.fullmatch(rid) else ""


def _body(content: Any) -> str | bytes:
    """bytes (the SDK base64-decodes) -> str when valid UTF-8, bytes otherwise."""
    if content is None:
        return ""
    if isinstance(content, (bytearray, memoryview)):
        content = bytes(content)
    if isinstance(content, bytes):
        try:
            return content.decode("utf-8")
        except UnicodeDecodeError:
            return content
    if isinstance(content, str):
        return content
    return str(content)


def _epoch_ms(value: Any) -> int | None:
    """NextVisibleTime as an int (it is a str in ChangeVisibility answers)."""
    if isinstance(value, bool):
        return None
    try:
        ms = int(value)
    except (TypeError, ValueError):
        return None
    return ms if ms > 1 else None  # an SDK Message() that was never received says 1


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

    def __init__(self, queue: Any, name: str) -> None:
        client = queue.mns_client
        scheme = "https" if getattr(client, "is_https", False) else "http"
        self._endpoint = f"{scheme}://{client.host}"
        self._name = name
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

    def new_queue(self) -> Any:
        """A new Account and Queue for the calling thread (never shared)."""
        account = Account(self._endpoint, credentials_provider=self.credentials_provider())
        client = account.mns_client
        client.version = self._version
        client.http.set_keep_alive(self._keep_alive)
        queue = account.get_queue(self._name)
        queue.set_encoding(self._encoding)
        return queue


class MNSBackend(CloudBackend):
    """leasekeeper's backend for one MNS queue.

    ``MNSBackend(queue, *, clock=None, queue_visibility_timeout=None)``.
    ``queue`` is an ``mns.queue.Queue`` (``Account(...).get_queue(name)``); the
    backend copies its endpoint, credentials provider and encoding and never
    sends a request through it (see the module docstring). ``queue_visibility_timeout``
    is the queue's VisibilityTimeout, if you know it: otherwise it is read once
    with GetQueueAttributes when first needed and cached (call
    ``refresh_queue_attributes()`` after changing it).

    ``extend`` is ChangeMessageVisibility to ``ceil(timeout)`` seconds for each
    handle (a new receipt each); ``release`` the same to the delay rounded down,
    but at least 1 s (MNS refuses 0, so ``release(delay=0)`` makes the message
    visible after one second); ``delete`` is DeleteMessage for one handle and
    BatchDeleteMessage (16 a call) for several.
    """

    service = "MNS"
    logger = log
    bad_argument_code = "InvalidArgument"
    min_receive_visibility = MIN_VISIBILITY  # the change after a receive refuses 0
    min_release = MIN_VISIBILITY  # ChangeMessageVisibility refuses 0

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
        scheme = "https" if getattr(client, "is_https", False) else "http"
        self.endpoint: str = f"{scheme}://{host}"
        self._provider: Any = client.credentials_provider
        self.clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self._factory = _QueueFactory(queue, self.queue_name)
        self._clients = ThreadClients(
            lambda: _Connection(self._new_queue()), _close_connection, log
        )
        # Guards _queue_vt.
        self._lock = threading.Lock()
        self._queue_vt: float | None = (
            None if queue_visibility_timeout is None else float(queue_visibility_timeout)
        )
        self._skew_warned = False

    def spec(self) -> MNSSpec:
        """This endpoint and queue; credentials from the other process's environment
        (``MNS_ACCESS_KEY_ID``/``MNS_ACCESS_KEY_SECRET``, see ``leasekeeper.backends.spec``)."""
        return MNSSpec(self.endpoint, self.queue_name)

    def __repr__(self) -> str:
        return f"MNSBackend(host={self.host!r}, queue={self.queue_name!r})"

    # ------------------------------------------------------------------ clients

    def _new_queue(self) -> Any:
        return self._factory.new_queue()

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
        """Close the connections of the per-thread clients this backend made.

        A thread that calls the backend afterwards gets a new client. The ``Queue``
        you passed in is untouched: it is yours.
        """
        self._clients.close()

    def __enter__(self) -> MNSBackend:
        return self

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
        ``mns:GetQueueAttributes``, or pass ``queue_visibility_timeout=``).
        """
        with self._lock:
            cached = self._queue_vt
        if cached is not None:
            return cached
        queue = self._queue()
        request = GetQueueAttributesRequest(self.queue_name)
        response = GetQueueAttributesResponse()
        error: ReceiveError | None = None
        try:
            # The client call, not Queue.get_attributes(): that one fills deprecated
            # QueueMeta fields and warns about each.
            queue.mns_client.get_queue_attributes(request, response)
        except Exception as exc:
            error = self.receive_error(exc, "GetQueueAttributes")
        if error is not None:
            raise error  # outside the except block: no chained SDK exception
        seconds = response.visibility_timeout
        if not is_seconds(seconds) or not MIN_VISIBILITY <= seconds <= MAX_VISIBILITY:
            raise MNSQueueError(
                "GetQueueAttributes", "retry", f"unexpected VisibilityTimeout {seconds!r}"
            )
        with self._lock:
            self._queue_vt = float(seconds)
        return float(seconds)

    def refresh_queue_attributes(self) -> float:
        """Forget the cached VisibilityTimeout and read it again."""
        with self._lock:
            self._queue_vt = None
        return self.queue_visibility_timeout()

    # ------------------------------------------------------------------ receiving

    def receive(
        self,
        max_messages: int = 1,
        wait_seconds: float = 0.0,
        visibility_timeout: float | None = None,
    ) -> list[Message]:
        """Receive up to ``max_messages`` (at most 16 a call) with BatchReceiveMessage.

        ``wait_seconds`` is the long poll, rounded **up** to whole seconds and capped
        at 30. ``visibility_timeout`` (0 < T <= 43200): the queue's own timeout
        applies to a receive; when T differs from it (after rounding T up), each
        message is changed to T at once (one ChangeMessageVisibility each). None
        keeps the queue's timeout. A failure raises ``MNSQueueError`` (a
        ``ReceiveError``; an empty queue is ``[]``).
        """
        return super().receive(max_messages, wait_seconds, visibility_timeout)

    def receive_messages(self, count: int, wait: float, visibility: float | None) -> list[Message]:
        poll = whole_seconds(wait, up=True)
        queue_vt = self.queue_visibility_timeout()  # before receiving: never strand messages
        queue = self._queue(CALL_TIMEOUT + poll)
        received_at = self.clock.now()  # just before the request: rule 1
        raws = self._receive_raw(queue, count, poll)
        if not raws:
            return []
        offset = self.clock.wall() - self.clock.now()  # epoch - monotonic, read together
        if visibility is None or whole_seconds(visibility, up=True) == int(queue_vt):
            asked = queue_vt if visibility is None else visibility
            return [self._received(raw, received_at, min(asked, queue_vt), offset) for raw in raws]
        return self._rehide(raws, received_at, visibility, queue_vt, offset)

    def _receive_raw(self, queue: Any, count: int, wait: int) -> list[Any]:
        error: ReceiveError | None = None
        try:
            return list(queue.batch_receive_message(count, wait))
        except Exception as exc:
            if isinstance(exc, MNSServerException) and _code_of(exc) == "MessageNotExist":
                return []  # on receive, MessageNotExist means "no message"
            error = self.receive_error(exc)
        raise error  # outside the except block: no chained SDK exception

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
        self,
        raws: list[Any],
        received_at: float,
        asked: float,
        queue_vt: float,
        offset: float,
    ) -> list[Message]:
        """Change each message's invisibility to ``asked`` (receive cannot choose it)."""
        seconds = max(MIN_VISIBILITY, whole_seconds(asked, up=True))
        queue = self._queue()
        out: list[Message] = []
        for raw in raws:
            receipt = raw.receipt_handle
            try:
                answer = queue.change_message_visibility(receipt, seconds)
            except Exception as exc:
                kind, detail = classify_error(exc, self._secrets([receipt]))
                if kind == "lost":
                    log.warning(
                        "message %r was lost right after the receive (%s); skipped",
                        str(raw.message_id),
                        detail,
                    )
                    continue
                log.warning(
                    "could not change message %r to the asked visibility_timeout (%s: %s); "
                    "it keeps the queue's %gs",
                    str(raw.message_id),
                    kind,
                    detail,
                    queue_vt,
                )
                out.append(self._received(raw, received_at, min(asked, queue_vt), offset))
                continue
            new_receipt = getattr(answer, "receipt_handle", None)
            if not isinstance(new_receipt, str) or not new_receipt:
                log.warning("message %r: no receipt handle in the answer; skipped", raw.message_id)
                continue
            # raw now describes the message as it is: newest handle, new deadline.
            raw.receipt_handle = new_receipt
            next_visible = _epoch_ms(getattr(answer, "next_visible_time", None))
            if next_visible is not None:
                raw.next_visible_time = next_visible
            # received_at stays the time before the receive: earlier than the change,
            # so received_at + asked is never later than the service's deadline.
            out.append(self._received(raw, received_at, asked, offset))
        return out

    def _received(self, raw: Any, received_at: float, vis: float, offset: float) -> Message:
        hint = self._hint(raw, offset, margin=0.0)
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
        return _message(self, raw, received_at, vis, hint)

    @staticmethod
    def _hint(raw: Any, offset: float, margin: float) -> float | None:
        ms = _epoch_ms(getattr(raw, "next_visible_time", None))
        return None if ms is None else ms / 1000.0 - offset - margin

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
        elif is_seconds(visibility_timeout) and visibility_timeout >= 0:
            vis = float(visibility_timeout)
        else:
            raise ValueError(
                f"visibility_timeout must be a number of seconds >= 0, got {visibility_timeout!r}"
            )
        now = self.clock.now()
        offset = self.clock.wall() - now
        hint = self._hint(raw, offset, margin=ADOPT_SKEW_MARGIN)
        return _message(self, raw, now, vis, hint)

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
            if not isinstance(entry, dict):
                continue
            receipt = entry.get("ReceiptHandle")
            code = entry.get("ErrorCode")
            if isinstance(receipt, str):
                failed[receipt] = (
                    code
                    if isinstance(code, str) and _CODE_SHAPE.fullmatch(code)
                    else ("UnknownError")
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


def _close_connection(connection: _Connection) -> None:
    connection.queue.mns_client.close_connection()


def _message(
    backend: MNSBackend, raw: Any, received_at: float, vis: float, hint: float | None
) -> Message:
    """A leasekeeper Message of ``backend`` for the SDK message ``raw``."""
    message_id = raw.message_id
    if not isinstance(message_id, str) or not message_id:
        raise ValueError("the MNS message has no message_id: it cannot be leased")
    receipt = raw.receipt_handle
    if not isinstance(receipt, str) or not receipt:
        raise ValueError(
            f"message {message_id!r} has no receipt handle (was it peeked or sent "
            "rather than received?): it cannot be leased"
        )
    count = raw.dequeue_count
    return Message(
        id=message_id,
        body=_body(raw.message_body),
        receipt=receipt,
        backend=backend,
        received_at=received_at,
        visibility_timeout=vis,
        receive_count=count if isinstance(count, int) and count > 0 else 1,
        raw=raw,
        deadline_hint=hint,
        hard_deadline=None,  # MNS documents no cap on the total invisibility
    )


@dataclass(frozen=True)
class MNSSpec:
    """An Aliyun MNS queue; credentials from the building process's environment:
    ``MNS_ACCESS_KEY_ID``, ``MNS_ACCESS_KEY_SECRET`` and optionally
    ``MNS_SECURITY_TOKEN`` (on a Spark cluster: ``spark.executorEnv.*``)."""

    endpoint: str
    queue_name: str

    def build(self) -> MNSBackend:
        access_id = os.environ.get("MNS_ACCESS_KEY_ID")
        access_key = os.environ.get("MNS_ACCESS_KEY_SECRET")
        if not access_id or not access_key:
            raise ConfigError(
                "an MNS spec builds its backend with MNS_ACCESS_KEY_ID and "
                "MNS_ACCESS_KEY_SECRET from the environment, and they are not set there "
                "(on a Spark cluster: spark.executorEnv.MNS_ACCESS_KEY_ID etc.)"
            )
        token = os.environ.get("MNS_SECURITY_TOKEN", "")
        account = Account(self.endpoint, access_id, access_key, token)
        return MNSBackend(account.get_queue(self.queue_name))
