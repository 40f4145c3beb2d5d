"""SQSBackend: leasekeeper on Amazon SQS, through a boto3 client.

::

    import boto3
    from leasekeeper import LeaseManager
    from leasekeeper.backends.sqs import SQSBackend

    backend = SQSBackend(boto3.client("sqs"), queue_url)
    with LeaseManager(backend, visibility_timeout=60) as manager:
        for message in backend.receive(max_messages=10, wait_seconds=20):
            with manager.lease(message):
                handle(message.body)

How SQS maps onto the backend contract (see docs/backends/sqs.md):

- A receipt handle is issued by every *receive* and is **not** rotated by
  ChangeMessageVisibility, so ``rotates_receipts`` is False.
- ``extend``/``release`` use ChangeMessageVisibilityBatch and ``delete`` uses
  DeleteMessageBatch, for any number of handles (chunks of 10), even one: a
  single code path, the same IAM permissions as the single calls
  (sqs:ChangeMessageVisibility, sqs:DeleteMessage) and every entry's outcome read
  from ``Successful``/``Failed``. The single-message APIs are never called; a
  *whole-call* "lost" or "capped" answer on a batch of several entries (which does
  not say which entry it is about) is resolved by re-sending each entry as a
  batch of one.
- VisibilityTimeout and WaitTimeSeconds are ints: extends round **up** (the
  manager counts its deadline from the float it asked for, so a longer real
  invisibility is the safe side), and so does a receive's long poll (0.5 s is a
  1 s poll, not a 0 s one that would make an idle worker busy-poll; see
  ``CloudBackend.receive`` for why the deadlines stay safe); release delays
  round **down** (a released message, and on a FIFO queue its message group, is
  never held back longer than asked).
- SQS lets a message stay invisible at most 12 hours (43200 s) after the receive
  that issued its handle. ``Message.hard_deadline`` is ``received_at + 43200 -
  hard_deadline_margin`` (60 s by default), so the manager stops extending, and
  reports the lease "capped", a minute before the service would refuse; the
  service's own "beyond the limit" error is mapped to ``capped`` as well.

Errors are mapped on both ``Error.Code`` and ``Error.QueryErrorCode`` (SQS speaks
the JSON protocol in query-compatible mode, where ``Code`` carries the legacy name
such as ``AWS.SimpleQueueService.NonExistentQueue`` and ``QueryErrorCode`` the
short one), for whole-call errors and per-entry ``Failed`` codes alike: see
``classify_error``. ``Outcome.detail`` carries error codes and fixed phrases only,
never the service's message text, which can quote the receipt handle; the message
text is logged at DEBUG level with anything handle-like scrubbed out. A failed
``receive`` raises ``leasekeeper.errors.ReceiveError`` ("retry" or "fatal"), with
the botocore exception chained as its cause (a receive request carries no receipt).
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

try:
    import boto3
    from botocore.exceptions import (
        BaseEndpointResolverError,
        ClientError,
        InvalidConfigError,
        NoCredentialsError,
        ParamValidationError,
        PartialCredentialsError,
        ProfileNotFound,
        UnknownCredentialError,
    )
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import HTTPClientError as BotoHTTPClientError
except ImportError as _exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "leasekeeper.backends.sqs needs boto3, which is not installed: "
        "pip install 'leasekeeper[sqs]'"
    ) from _exc

from leasekeeper.backends import credentials
from leasekeeper.backends.base import (
    REDACTED,
    CloudBackend,
    ErrorTable,
    Handle,
    Message,
    Outcome,
    OutcomeKind,
    check_seconds,
    chunked,
    redact,
    whole_seconds,
)
from leasekeeper.clock import SYSTEM_CLOCK, Clock
from leasekeeper.errors import ConfigError, ReceiveError

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import (
        BatchResultErrorEntryTypeDef,
        ChangeMessageVisibilityBatchRequestEntryTypeDef,
        DeleteMessageBatchRequestEntryTypeDef,
    )

__all__ = ["SQSBackend", "classify_error", "classify_exception"]

log = logging.getLogger("leasekeeper.backends.sqs")

MAX_BATCH = 10
MAX_VISIBILITY = 43200  # seconds: per call, and in total after a receive
MAX_WAIT_SECONDS = 20
DEFAULT_HARD_DEADLINE_MARGIN = 60.0

_LEGACY_PREFIX = "AWS.SimpleQueueService."

# Codes after dropping the legacy "AWS.SimpleQueueService." prefix.
_LOST_CODES = frozenset({"ReceiptHandleIsInvalid", "MessageNotInflight"})
_RETRY_CODES = frozenset(
    {
        "RequestThrottled",
        "ThrottlingException",
        "Throttling",
        "ThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "InternalError",
        "InternalFailure",
        "InternalServerError",
        "RequestTimeout",
        "RequestTimeoutException",
        "KmsThrottled",
        "KMS.ThrottlingException",
    }
)
_FATAL_CODES = frozenset(
    {
        "NonExistentQueue",
        "QueueDoesNotExist",
        "AccessDenied",
        "AccessDeniedException",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "InvalidSignatureException",
        "UnrecognizedClientException",
        "IncompleteSignature",
        "MissingAuthenticationToken",
        "InvalidAccessKeyId",
        "ExpiredToken",
        "ExpiredTokenException",
        "RequestExpired",
        "InvalidSecurity",
        "OptInRequired",
        "NotAuthorized",
        "UnsupportedOperation",
        "InvalidAddress",
        "KmsAccessDenied",
        "KmsDisabled",
        "KmsInvalidKeyUsage",
        "KmsInvalidState",
        "KmsNotFound",
        "KmsOptInRequired",
    }
)
# Whole-call errors that mean leasekeeper sent a malformed request.
_BUG_CODES = frozenset(
    {
        "TooManyEntriesInBatchRequest",
        "EmptyBatchRequest",
        "BatchEntryIdsNotDistinct",
        "InvalidBatchEntryId",
        "BatchRequestTooLong",
        "MissingParameter",
        "InvalidParameterCombination",
        "InvalidAction",
        "ValidationError",
        "ValidationException",
        "MalformedQueryString",
        "InvalidQueryParameter",
        "SerializationException",
    }
)
_INVALID_PARAMETER = frozenset({"InvalidParameterValue", "InvalidParameterValueException"})
ERRORS = ErrorTable(lost=_LOST_CODES, retry=_RETRY_CODES, fatal=_FATAL_CODES, bug=_BUG_CODES)

# InvalidParameterValue is told apart by its message text: (lower-cased phrase, kind, note).
_INVALID_PARAMETER_CASES: tuple[tuple[str, OutcomeKind, str], ...] = (
    ("beyond the limit", "capped", "total visibility beyond the limit [43200 seconds]"),
    # extend of a handle whose message is no longer in flight (deleted, re-received)
    ("does not exist or is not available", "lost", "message not in flight"),
    # FIFO: delete/extend with an expired handle
    ("receipt handle has expired", "lost", "receipt handle expired"),
    # any other reason the handle itself is refused
    ("parameter receipthandle is invalid", "lost", "receipt handle refused"),
)

_CODE_SHAPE = re.compile(r"[A-Za-z0-9._:#-]{1,100}")
# A receipt handle is a long base64-like token; scrub anything that looks like one.
_TOKEN = re.compile(r"[A-Za-z0-9+/=_-]{32,}")
_REDACTIONS = ((_TOKEN, REDACTED),)
_ENTRY_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")


def _clean_code(code: object) -> str:
    """An error code fit for a detail or a log line, or "" (codes are identifiers)."""
    if not isinstance(code, str) or not _CODE_SHAPE.fullmatch(code):
        return ""
    return code


def _short(code: str) -> str:
    return code[len(_LEGACY_PREFIX) :] if code.startswith(_LEGACY_PREFIX) else code


def scrub(text: str, receipts: Iterable[str] = ()) -> str:
    """``text`` with the given receipts and anything handle-like replaced."""
    return redact(text, receipts, _REDACTIONS)


def classify_error(
    code: str,
    query_code: str = "",
    message: str = "",
    *,
    status: int | None = None,
    sender_fault: bool | None = None,
) -> tuple[OutcomeKind, str]:
    """Map an SQS error to an outcome kind and a detail that quotes no receipt.

    ``code``/``query_code`` are ``Error.Code``/``Error.QueryErrorCode`` of a
    ClientError (or a ``Failed`` entry's ``Code``), ``message`` the error message
    (read only to tell the InvalidParameterValue cases apart, never returned),
    ``status`` the HTTP status and ``sender_fault`` a ``Failed`` entry's flag.

    Unrecognised codes are "retry" (rule 5: a lease is declared lost only on a
    definitive answer; the manager stops retrying when the lease's deadline
    passes), so a new transient error cannot end healthy leases.
    """
    codes = [c for c in (_clean_code(code), _clean_code(query_code)) if c]
    shorts = {_short(c) for c in codes}
    detail = " / ".join(dict.fromkeys(codes)) or "unknown error"
    kind: OutcomeKind = "retry"
    note = ""
    known = ERRORS.kind(*shorts)
    if shorts & _INVALID_PARAMETER:
        text = message.lower() if isinstance(message, str) else ""
        kind, note = "fatal", "request rejected (a leasekeeper bug? please report)"
        for phrase, case_kind, case_note in _INVALID_PARAMETER_CASES:
            if phrase in text:
                kind, note = case_kind, case_note
                break
    elif known is not None:
        kind = known
        if known == "fatal" and not shorts & ERRORS.fatal - ERRORS.bug:
            note = "malformed request (a leasekeeper bug, please report)"
    elif status is not None and status >= 500:
        note = f"HTTP {status}"
    elif sender_fault is False:
        note = "server fault"
    else:
        note = "unrecognised"
    return kind, f"{detail}: {note}" if note else detail


def _classify_exception(exc: BaseException) -> tuple[OutcomeKind, str, str]:
    """(kind, detail, message text) for an exception a boto3 call raised."""
    if isinstance(exc, ClientError):
        error: Mapping[str, Any] = exc.response.get("Error", {}) or {}
        meta: Mapping[str, Any] = exc.response.get("ResponseMetadata", {}) or {}
        status = meta.get("HTTPStatusCode")
        message = str(error.get("Message", "") or "")
        kind, detail = classify_error(
            str(error.get("Code", "") or ""),
            str(error.get("QueryErrorCode", "") or ""),
            message,
            status=status if isinstance(status, int) else None,
        )
        return kind, detail, message
    name = type(exc).__name__
    # botocore's exception text may quote request parameters (receipts): never kept.
    if isinstance(exc, (BotoConnectionError, BotoHTTPClientError)):
        return "retry", name, ""
    if isinstance(
        exc,
        (
            NoCredentialsError,
            PartialCredentialsError,
            UnknownCredentialError,
            ProfileNotFound,
            InvalidConfigError,
            BaseEndpointResolverError,
        ),
    ):
        # Which variable is missing, and where it goes on a cluster (executors).
        return "fatal", f"{name}: {credentials.aws_configuration(exc)}", ""
    if isinstance(exc, ParamValidationError):
        return "fatal", f"{name}: malformed request (a leasekeeper bug, please report)", ""
    return "retry", name, ""


def classify_exception(exc: BaseException) -> tuple[OutcomeKind, str]:
    """``classify_error`` for an exception a boto3 SQS call raised (a ClientError or
    a botocore connection/configuration error): its outcome kind, and a detail that
    names the error code and never quotes the request or the service's message.
    Useful around your own ``receive`` loop: "fatal" means stop, "retry" back off.
    """
    kind, detail, _ = _classify_exception(exc)
    return kind, detail


# Set on a thread while it is inside one of leasekeeper's own batch calls.
_OWN_CALL = threading.local()
_OWN_OPERATIONS = ("ChangeMessageVisibilityBatch", "DeleteMessageBatch")


def _one_attempt(
    response: Any = None,
    caught_exception: BaseException | None = None,
    operation: Any = None,
    **_: Any,
) -> None:
    """botocore ``needs-retry`` hook: end leasekeeper's own calls after one attempt.

    botocore would retry a 5xx, a throttle or a reset inside the call, sleeping up
    to seconds between attempts while the lease's deadline runs out, and would
    not know the deadline. The manager retries these itself, within each lease's
    remaining time, so its calls fail fast instead: the attempt's own exception,
    or the ClientError botocore would have raised. Calls the application makes on
    the same client are left to botocore's retry policy.
    """
    if not getattr(_OWN_CALL, "active", False):
        return None
    if caught_exception is not None:
        raise caught_exception
    if response is None:
        return None
    http_response, parsed = response
    if getattr(http_response, "status_code", 200) < 300:
        return None
    name = getattr(operation, "name", "") or "SQS call"
    raise ClientError(parsed, name)


def _int_attribute(attributes: Mapping[str, Any], name: str) -> int | None:
    value = attributes.get(name)
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


class SQSBackend(CloudBackend):
    """Leases on one SQS queue (standard or FIFO), through a boto3 SQS client.

    ``client`` is ``boto3.client("sqs", ...)`` (clients are thread-safe; resources
    are not, so pass a client). ``queue_url`` is the queue's URL. ``clock`` is the
    monotonic clock deadlines are measured on (the manager's, by default the
    system's).

    leasekeeper retries a failed extend, delete or release itself, within each
    lease's remaining time. So by default its own calls (ChangeMessageVisibilityBatch,
    DeleteMessageBatch) make one attempt each: botocore's retries, whose backoff
    knows nothing of the lease's deadline, are skipped for them through a
    ``needs-retry`` event hook that touches no other call on the client.
    ``client_retries=True`` leaves botocore's policy in charge of them too. Short
    ``connect_timeout``/``read_timeout`` keep a hung call from eating the
    extend threshold (see docs/backends/sqs.md).
    """

    service = "SQS"
    logger = log
    bad_argument_code = "InvalidParameterValue"
    min_receive_visibility = 0  # VisibilityTimeout=0: received and visible at once
    min_release = 0

    max_batch: int = MAX_BATCH
    max_visibility: float = float(MAX_VISIBILITY)
    rotates_receipts: bool = False
    max_receive: int = MAX_BATCH  # messages per ReceiveMessage
    max_wait_seconds: float = float(MAX_WAIT_SECONDS)  # longest long poll
    #: Taken off SQS's 12-hour total so the manager stops extending in time.
    hard_deadline_margin: float = DEFAULT_HARD_DEADLINE_MARGIN

    def __init__(
        self,
        client: SQSClient,
        queue_url: str,
        *,
        clock: Clock | None = None,
        client_retries: bool = False,
    ) -> None:
        if not isinstance(queue_url, str) or not queue_url:
            raise ValueError("queue_url must be the queue's URL (a non-empty str)")
        self._client = client
        self.client_retries = client_retries
        events = getattr(getattr(client, "meta", None), "events", None)
        if not client_retries and events is not None:
            for operation in _OWN_OPERATIONS:  # the unique id: once per client
                events.register_first(
                    f"needs-retry.sqs.{operation}",
                    _one_attempt,
                    unique_id=f"leasekeeper-one-attempt-{operation}",
                )
        self.queue_url = queue_url
        self.clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        # Guards the cached queue visibility timeout (fetched at most once).
        self._attr_lock = threading.Lock()
        self._queue_visibility: float | None = None
        self._system_attribute_names = _supports_system_attribute_names(client)

    def spec(self) -> SQSSpec:
        """This queue, the client's region and endpoint; credentials from the other
        process's AWS credential chain (see ``leasekeeper.backends.spec``)."""
        meta = getattr(self._client, "meta", None)
        return SQSSpec(
            self.queue_url,
            region=getattr(meta, "region_name", None),
            endpoint_url=getattr(meta, "endpoint_url", None),
            client_retries=self.client_retries,
        )

    def __repr__(self) -> str:
        return f"SQSBackend(queue_url={self.queue_url!r})"

    @property
    def client(self) -> SQSClient:
        return self._client

    # ------------------------------------------------------------------ queue settings

    def queue_visibility_timeout(self) -> float:
        """The queue's VisibilityTimeout attribute, read once (GetQueueAttributes) and
        cached. A failed read raises ``ReceiveError`` (operation "GetQueueAttributes")."""
        with self._attr_lock:
            if self._queue_visibility is None:
                try:
                    response = self._client.get_queue_attributes(
                        QueueUrl=self.queue_url, AttributeNames=["VisibilityTimeout"]
                    )
                except Exception as exc:
                    raise self.receive_error(exc, "GetQueueAttributes") from exc
                value = response.get("Attributes", {}).get("VisibilityTimeout")
                try:
                    seconds = float(value) if value is not None else math.nan
                except (TypeError, ValueError):
                    seconds = math.nan
                if not 0 <= seconds <= MAX_VISIBILITY:
                    raise ReceiveError(
                        "retry",
                        "no usable VisibilityTimeout in the answer",
                        operation="GetQueueAttributes",
                        service=self.service,
                    )
                self._queue_visibility = seconds
                log.debug("queue %s: VisibilityTimeout is %gs", self.queue_url, seconds)
            return self._queue_visibility

    def _visibility(self, visibility_timeout: float | None) -> float:
        if visibility_timeout is None:
            return self.queue_visibility_timeout()
        return check_seconds("visibility_timeout", visibility_timeout, high=MAX_VISIBILITY)

    # ------------------------------------------------------------------ receiving

    def receive(
        self,
        max_messages: int = 1,
        wait_seconds: float = 0.0,
        visibility_timeout: float | None = None,
    ) -> list[Message]:
        """ReceiveMessage: up to ``max_messages`` (at most 10 a call), long-polling up
        to ``wait_seconds`` (at most 20; a fraction is rounded **up** to whole
        seconds), hidden for ``visibility_timeout`` seconds (0-43200; default: the
        queue's own, read once with GetQueueAttributes). A failure of the call
        raises ``ReceiveError`` ("retry" or "fatal"; the botocore error is its cause).
        """
        return super().receive(max_messages, wait_seconds, visibility_timeout)

    def receive_messages(self, count: int, wait: float, visibility: float | None) -> list[Message]:
        vis = self._visibility(visibility)
        # Up: 0.5 s is a 1 s long poll, not a 0 s one (an idle worker would
        # busy-poll). The deadline below counts from before the request, so the
        # poll's length never makes it later than SQS's own (CloudBackend.receive).
        poll = whole_seconds(wait, up=True)
        # Asking for the float's ceiling: the real invisibility is never shorter than
        # the visibility the deadline is computed from.
        asked = whole_seconds(vis, up=True)
        # Rule 1: the deadline counts from just before the request is sent.
        received_at = self.clock.now()
        try:
            if self._system_attribute_names:
                response = self._client.receive_message(
                    QueueUrl=self.queue_url,
                    MaxNumberOfMessages=count,
                    WaitTimeSeconds=poll,
                    VisibilityTimeout=asked,
                    MessageSystemAttributeNames=["All"],
                    MessageAttributeNames=["All"],
                )
            else:  # pragma: no cover - botocore older than MessageSystemAttributeNames
                response = self._client.receive_message(
                    QueueUrl=self.queue_url,
                    MaxNumberOfMessages=count,
                    WaitTimeSeconds=poll,
                    VisibilityTimeout=asked,
                    AttributeNames=["All"],
                    MessageAttributeNames=["All"],
                )
        except Exception as exc:
            # A receive request carries no receipt: the botocore error may be chained.
            raise self.receive_error(exc) from exc
        hard_deadline = received_at + MAX_VISIBILITY - self.hard_deadline_margin
        messages = [
            self._message(
                data=raw,
                raw=raw,
                received_at=received_at,
                visibility=vis,
                deadline_hint=None,
                hard_deadline=hard_deadline,
            )
            for raw in response.get("Messages", [])
        ]
        if messages:
            log.debug("received %d message(s) from %s", len(messages), self.queue_url)
        return messages

    def _message(
        self,
        *,
        data: Mapping[str, object],
        raw: Any,
        received_at: float,
        visibility: float,
        deadline_hint: float | None,
        hard_deadline: float,
    ) -> Message:
        missing = [key for key in ("MessageId", "ReceiptHandle", "Body") if key not in data]
        if missing:
            raise ValueError(
                f"an SQS message needs {', '.join(missing)}; got one with keys "
                f"{sorted(str(key) for key in data)}"
            )
        attributes = data.get("Attributes")
        count = (
            _int_attribute(attributes, "ApproximateReceiveCount")
            if isinstance(attributes, Mapping)
            else None
        )
        body = data["Body"]
        return Message(
            id=str(data["MessageId"]),
            body=body if isinstance(body, (str, bytes)) else str(body),
            receipt=str(data["ReceiptHandle"]),
            backend=self,
            received_at=received_at,
            visibility_timeout=visibility,
            receive_count=count if count is not None and count > 0 else 1,
            raw=raw,
            deadline_hint=deadline_hint,
            hard_deadline=hard_deadline,
        )

    def adopt(self, raw: Any, visibility_timeout: float | None = None) -> Message:
        """Lease a message you received yourself: a message dict from
        ``client.receive_message(...)["Messages"]`` or a boto3 resource
        ``sqs.Message`` (from ``queue.receive_messages()``).

        Call it **right after** receiving: the local receive time is unknown, so it
        is taken as now. Pass the ``visibility_timeout`` you received with; without
        one, the queue's VisibilityTimeout is read once (GetQueueAttributes) and
        cached. Attributes you asked for can only shorten the estimate: on a first
        delivery (ApproximateReceiveCount 1) ApproximateFirstReceiveTimestamp is the
        receive time itself, and the deadline and 12-hour cap are counted from it;
        otherwise ApproximateFirstReceiveTimestamp and SentTimestamp are only known
        to be earlier than the receive and shorten the deadline when that still
        leaves it in the future (a redelivered or long-queued message is not
        refused for an old timestamp).
        """
        data, raw_obj = _native(raw, self.queue_url)
        visibility = self._visibility(visibility_timeout)
        now = self.clock.now()
        wall = self.clock.wall()
        attributes: Mapping[str, Any] = data.get("Attributes") or {}
        count = _int_attribute(attributes, "ApproximateReceiveCount")
        first = _int_attribute(attributes, "ApproximateFirstReceiveTimestamp")
        sent = _int_attribute(attributes, "SentTimestamp")

        def local(epoch_ms: int) -> float:
            return now - (wall - epoch_ms / 1000.0)

        received_at = now
        hard_deadline = now + MAX_VISIBILITY - self.hard_deadline_margin
        deadline_hint: float | None = None
        if count == 1 and first is not None:
            # This receive was the first, so its time is known (up to clock skew).
            received = local(first)
            if received < now:
                deadline_hint = received + visibility
                hard_deadline = received + MAX_VISIBILITY - self.hard_deadline_margin
        else:
            # Only known to be earlier than this receive: a shorter deadline, kept
            # when it still lies ahead.
            loose = [local(ms) for ms in (first, sent) if ms is not None]
            if loose:
                hint = max(loose) + visibility
                if now < hint < now + visibility:
                    deadline_hint = hint
        return self._message(
            data=data,
            raw=raw_obj,
            received_at=received_at,
            visibility=visibility,
            deadline_hint=deadline_hint,
            hard_deadline=hard_deadline,
        )

    # ------------------------------------------------------------------ batch operations

    def extend(self, handles: Sequence[Handle], timeout: float) -> list[Outcome]:
        """ChangeMessageVisibilityBatch to ``timeout`` seconds, rounded up."""
        return super().extend(handles, timeout)

    def release(self, handles: Sequence[Handle], delay: float) -> list[Outcome]:
        """ChangeMessageVisibilityBatch to ``delay`` seconds, rounded down."""
        return super().release(handles, delay)

    def delete(self, handles: Sequence[Handle]) -> list[Outcome]:
        """DeleteMessageBatch."""
        return super().delete(handles)

    def send_extend(self, handles: Sequence[Handle], seconds: int) -> list[Outcome]:
        return self._run("extend", handles, seconds)

    def send_release(self, handles: Sequence[Handle], seconds: int) -> list[Outcome]:
        return self._run("release", handles, seconds)

    def send_delete(self, handles: Sequence[Handle]) -> list[Outcome]:
        return self._run("delete", handles, None)

    def _run(self, operation: str, handles: Sequence[Handle], seconds: int | None) -> list[Outcome]:
        def send(batch: Sequence[Handle]) -> list[Outcome]:
            return self._batch(operation, batch, seconds)

        out: list[Outcome] = []
        for chunk in chunked(handles, MAX_BATCH):
            out.extend(self.whole_call(operation, chunk, send))
        return out

    def _batch(
        self, operation: str, handles: Sequence[Handle], seconds: int | None
    ) -> list[Outcome]:
        """One batch call; raises what boto3 raises (``whole_call`` maps it)."""
        ids = [str(index) for index in range(len(handles))]
        _OWN_CALL.active = not self.client_retries
        try:
            if seconds is None:
                delete_entries: list[DeleteMessageBatchRequestEntryTypeDef] = [
                    {"Id": entry_id, "ReceiptHandle": handle.receipt}
                    for entry_id, handle in zip(ids, handles, strict=True)
                ]
                response = self._client.delete_message_batch(
                    QueueUrl=self.queue_url, Entries=delete_entries
                )
                successful = response.get("Successful", [])
                failed = response.get("Failed", [])
            else:
                change_entries: list[ChangeMessageVisibilityBatchRequestEntryTypeDef] = [
                    {"Id": entry_id, "ReceiptHandle": handle.receipt, "VisibilityTimeout": seconds}
                    for entry_id, handle in zip(ids, handles, strict=True)
                ]
                change = self._client.change_message_visibility_batch(
                    QueueUrl=self.queue_url, Entries=change_entries
                )
                successful = change.get("Successful", [])
                failed = change.get("Failed", [])
        finally:
            _OWN_CALL.active = False
        return self._outcomes(operation, handles, successful, failed)

    def _outcomes(
        self,
        operation: str,
        handles: Sequence[Handle],
        successful: Sequence[Mapping[str, Any]],
        failed: Sequence[BatchResultErrorEntryTypeDef] | Sequence[Mapping[str, Any]],
    ) -> list[Outcome]:
        """One outcome per handle, in order, from the batch's Successful/Failed lists."""
        ids = [str(index) for index in range(len(handles))]
        by_index = dict(zip(ids, handles, strict=True))
        receipts = [handle.receipt for handle in handles]
        by_id: dict[str, Outcome] = {}
        for entry in successful:
            by_id[str(entry.get("Id"))] = Outcome("ok")
        for entry in failed:
            entry_id = str(entry.get("Id"))
            code = str(entry.get("Code", "") or "")
            text = str(entry.get("Message", "") or "")
            sender_fault = entry.get("SenderFault")
            kind, detail = classify_error(
                code,
                "",
                text,
                sender_fault=sender_fault if isinstance(sender_fault, bool) else None,
            )
            failure = by_id[entry_id] = Outcome(kind, detail=scrub(detail, receipts))
            handle = by_index.get(entry_id)
            self.log_failure(
                operation,
                [handle] if handle is not None else handles,
                failure,
                _said(text, receipts),
            )
        out: list[Outcome] = []
        for entry_id in ids:
            outcome = by_id.get(entry_id)
            if outcome is None:
                log.warning(
                    "%s on %s: entry %s missing from both Successful and Failed; "
                    "treated as transient",
                    operation,
                    self.queue_url,
                    entry_id,
                )
                outcome = Outcome("retry", detail="entry missing from the batch response")
            out.append(outcome)
        return out

    # ------------------------------------------------------------------ errors

    def classify(self, exc: BaseException, receipts: Sequence[str] = ()) -> Outcome:
        """``classify_exception``, with ``receipts`` scrubbed out of the detail."""
        kind, detail, _ = _classify_exception(exc)
        return Outcome(kind, detail=scrub(detail, receipts))

    def failure_note(self, exc: BaseException, receipts: Sequence[str]) -> str:
        _, _, text = _classify_exception(exc)
        return _said(text, receipts)


def _said(text: str, receipts: Sequence[str]) -> str:
    """The service's own message for a log line, anything handle-like scrubbed out."""
    return f"service said: {scrub(text, receipts)}" if text else ""


def _native(raw: Any, queue_url: str) -> tuple[Mapping[str, Any], Any]:
    """The message dict inside ``raw`` (a dict, or a boto3 resource Message) of the
    queue at ``queue_url``."""
    if isinstance(raw, Mapping):
        return raw, raw
    meta = getattr(raw, "meta", None)
    if meta is not None and hasattr(raw, "receipt_handle") and hasattr(raw, "queue_url"):
        other = str(getattr(raw, "queue_url", "") or "")
        if other and _queue_path(other) != _queue_path(queue_url):
            raise ValueError(f"adopt(): the message is from queue {other!r}, not {queue_url!r}")
        data = getattr(meta, "data", None)
        if not isinstance(data, Mapping):
            raise ValueError(
                "adopt(): this sqs.Message resource carries no message data (it was "
                "built from a receipt handle, not received); pass a received message"
            )
        merged = dict(data)
        merged.setdefault("ReceiptHandle", raw.receipt_handle)
        return merged, raw
    raise TypeError(
        "SQSBackend.adopt() takes a message dict from receive_message() or a boto3 "
        f"sqs.Message resource, got {type(raw).__module__}.{type(raw).__qualname__}"
    )


def _queue_path(url: str) -> str:
    """The account/name part of a queue URL (hosts differ between endpoints)."""
    path = url.split("://", 1)[-1].split("/", 1)[-1]
    return path.strip("/")


def _supports_system_attribute_names(client: Any) -> bool:
    try:
        shape = client.meta.service_model.operation_model("ReceiveMessage").input_shape
        return "MessageSystemAttributeNames" in shape.members
    except Exception:  # an unusual client (a mock): use the current API
        return True


@dataclass(frozen=True)
class SQSSpec:
    """An SQS queue; credentials from the building process's AWS credential chain
    (environment, shared config/credentials files, instance or task role)."""

    queue_url: str
    region: str | None = None
    endpoint_url: str | None = None
    client_retries: bool = False  # SQSBackend's: leave botocore's retries on its calls

    def build(self) -> SQSBackend:
        try:
            region = self.region or credentials.aws_region()
            client = boto3.client("sqs", region_name=region, endpoint_url=self.endpoint_url)
        except BaseEndpointResolverError as exc:  # NoRegionError: say which variable
            detail = credentials.aws_configuration(exc)
            raise ConfigError(f"{type(exc).__name__}: {detail}") from exc
        return SQSBackend(client, self.queue_url, client_retries=self.client_retries)
