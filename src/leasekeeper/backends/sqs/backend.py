"""``SQSBackend``: leasekeeper on Amazon SQS, through a boto3 client::

    backend = SQSBackend(boto3.client("sqs"), queue_url)
    with LeaseManager(backend, visibility_timeout=60) as manager:
        for held in manager.receive(max_messages=10, wait_seconds=20):
            with held:  # leased from the moment it arrived
                handle(held.message.body)

Or ``leasekeeper.connect("https://sqs.eu-west-1.amazonaws.com/123456789012/jobs")``.
See docs/backends/sqs.md, and docs/backend-semantics.md for what SQS really does.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

# The SDK found, not imported: the renewer process's lean path renews without botocore.
if any(importlib.util.find_spec(sdk) is None for sdk in ("botocore", "boto3")):
    raise ImportError(  # pragma: no cover - exercised in a subprocess by the tests
        "leasekeeper.backends.sqs needs boto3, which is not installed: "
        "pip install 'boto3>=1.34' (what leasekeeper's sqs extra brings)"
    )

from leasekeeper.backends.cloud import CloudBackend, ReadOnce
from leasekeeper.backends.contract import OK, Handle, Message, Outcome, QueueCounts
from leasekeeper.backends.shared import (
    check_lease_age,
    check_seconds,
    chunked,
    said,
    whole_seconds,
)
from leasekeeper.backends.spec import URLSpec
from leasekeeper.backends.sqs.attempts import ReceiveAttempts
from leasekeeper.backends.sqs.deferred import DeferredClient, renewal_options
from leasekeeper.backends.sqs.errors import classify_error, classify_with_text, scrub
from leasekeeper.backends.sqs.lean import (
    CLIENT_METHODS,
    OWN_CALL,
    LazyModule,
    LeanPath,
    hooks_problem,
    lean_path,
    one_attempt_on,
)
from leasekeeper.backends.sqs.rebuild import sqs_credentials_problem, sqs_secrets, sqs_settings
from leasekeeper.clock import SYSTEM_CLOCK, Clock
from leasekeeper.errors import ReceiveError

if TYPE_CHECKING:
    from botocore import exceptions as boto
    from mypy_boto3_sqs import SQSClient
else:
    boto = LazyModule("botocore.exceptions")

__all__ = ["MAX_BATCH", "MAX_VISIBILITY", "MAX_WAIT_SECONDS", "SQSBackend"]

log = logging.getLogger("leasekeeper.backends.sqs")

MAX_BATCH = 10
MAX_VISIBILITY = 43200  # seconds: per call, and in total after a receive
MAX_WAIT_SECONDS = 20
MAX_DELAY = 900  # SendMessage's DelaySeconds
MAX_ATTRIBUTES = 10  # MessageAttributes a message carries

_MISSING = Outcome("retry", detail="entry missing from the batch response")


def _int_attribute(attributes: object, name: str) -> int | None:
    # ``type() is dict`` first: the worker's hot path (an ABC check costs more than the rest).
    if type(attributes) is not dict and not isinstance(attributes, Mapping):
        return None
    value = attributes.get(name)
    return int(value) if isinstance(value, (str, int)) and str(value).isdigit() else None


def _group(attributes: object) -> str | None:
    """A message's MessageGroupId (FIFO queues, and standard "fair" queues), else None."""
    if type(attributes) is not dict and not isinstance(attributes, Mapping):
        return None
    value = attributes.get("MessageGroupId")
    return value if isinstance(value, str) and value else None


def _check_received(data: Mapping[str, Any]) -> None:
    """ValueError where a message dict lacks what a received message has."""
    missing = [key for key in ("MessageId", "ReceiptHandle", "Body") if key not in data]
    if missing:
        raise ValueError(
            f"an SQS message needs {', '.join(missing)}; got one with keys "
            f"{sorted(str(key) for key in data)}"
        )


# The attributes queue_counts reads, in QueueCounts' order.
_COUNTS = (
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
)


def _message_attributes(data: Mapping[str, Any]) -> dict[str, str]:
    """The String and Number MessageAttributes of a message dict, by name."""
    found = data.get("MessageAttributes")
    if not found or not isinstance(found, Mapping):  # mostly none: the cheap check first
        return {}
    return {
        str(name): value["StringValue"]
        for name, value in found.items()
        if isinstance(value, Mapping)
        and str(value.get("DataType", "")).startswith(("String", "Number"))
        and isinstance(value.get("StringValue"), str)
    }


class SQSBackend(CloudBackend):
    """Leases on one SQS queue (standard or FIFO), through a boto3 SQS client.

    ``client`` is ``boto3.client("sqs", ...)`` (clients are thread-safe; resources
    are not). ``clock`` is the monotonic clock deadlines are measured on (the
    manager's). ``max_lease_age`` overrides SQS's 12 hours (a compatible service, a
    test); ``cap_margin`` (min(60 s, 2 %)) is taken off it.

    - ``receive``: ReceiveMessage (10 a call, long poll up to 20 s rounded up,
      ``visibility_timeout`` 0-43200 s, None: the queue's VisibilityTimeout, read
      once) with every attribute: ``receive_count`` is ApproximateReceiveCount,
      ``attributes`` the String and Number MessageAttributes. ChangeMessageVisibility
      keeps the receipt: ``rotates_receipts`` is False. On a FIFO queue each receive
      carries a ReceiveRequestAttemptId, sent again by the retries of the call and
      by the next receive after one that failed in transit (``attempts``), so SQS
      hands out the same messages instead of hiding them, and their groups, for a
      visibility timeout.
    - ``extend``/``release``: ChangeMessageVisibilityBatch (the timeout rounded up,
      the delay down), ``delete``: DeleteMessageBatch, for any number of handles,
      even one: one code path and one set of IAM permissions.
    - 12 hours after the receive SQS hides a message no longer: ``hard_deadline``
      is that less ``cap_margin``, and SQS's "beyond the limit" error is ``capped``.
    - ``send``: SendMessage (at most 10 attributes, ``delay`` up to 900 s).
    - ``queue_attributes()``, ``redrive_policy()``: the queue's attributes, read once.

    leasekeeper retries a failed extend, delete or release itself, within each
    lease's remaining time, so its own calls make one attempt each: a botocore
    ``needs-retry`` hook ends them, and no other call on the client, after one
    attempt. ``client_retries=True`` leaves them to botocore's policy too.

    ``fast_path`` (True): the hot calls (receive, extend, release, delete) take the
    lean path (``lean``, see ``leasekeeper.backends.sqs.lean``) wherever the client's
    configuration allows and it has no event hook of yours; False: the client for all.
    """

    service = "SQS"
    receipt_name = "receipt handle"
    logger = log
    bad_argument_code = "InvalidParameterValue"
    min_receive_visibility = 0  # VisibilityTimeout=0: received and visible at once
    min_release = 0
    carries_attributes = True
    attribute_limit = MAX_ATTRIBUTES
    max_send_delay = float(MAX_DELAY)
    chains_errors = True  # botocore's text for these calls quotes no receipt

    max_batch: int = MAX_BATCH
    max_visibility: float = float(MAX_VISIBILITY)
    rotates_receipts: bool = False
    max_receive: int = MAX_BATCH  # messages per ReceiveMessage
    max_wait_seconds: float = float(MAX_WAIT_SECONDS)  # longest long poll

    def __init__(
        self,
        client: SQSClient,
        queue_url: str,
        *,
        clock: Clock | None = None,
        client_retries: bool = False,
        max_lease_age: float | None = None,
        fast_path: bool = True,
    ) -> None:
        if not isinstance(queue_url, str) or not queue_url:
            raise ValueError("queue_url must be the queue's URL (a non-empty str)")
        self._client = client
        self.client_retries = client_retries
        self.fast_path = fast_path
        self._lean: LeanPath | None = None
        if fast_path:
            self._lean = client.lean if isinstance(client, DeferredClient) else lean_path(client)
        self._system_attribute_names = True  # the current API, until the client says
        if isinstance(client, DeferredClient):  # the renewer process's: made when needed
            client.when_made(self._adopt)
        else:
            self._adopt(client)
        self.queue_url = queue_url
        self.fifo = queue_url.rstrip("/").endswith(".fifo")
        self.clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self.max_lease_age = check_lease_age(max_lease_age, float(MAX_VISIBILITY))
        self._lease_age_given = max_lease_age is not None
        self._attributes = ReadOnce(self._read_attributes)
        self._attempts = ReceiveAttempts(self.clock)

    def _adopt(self, client: Any) -> None:
        if not self.client_retries:
            one_attempt_on(client)
        self._system_attribute_names = _supports_system_attribute_names(client)

    def credentials_problem(self) -> str | None:
        """Why another process could not renew as the client does (None: it can)."""
        return sqs_credentials_problem(self._client) or hooks_problem(self._client)

    def secret_options(self) -> dict[str, Any]:
        """Keys given in code, a proxy's password: for the renewer process only (with
        fixed keys on the lean path, how it renews without botocore)."""
        secrets = sqs_secrets(self._client)
        return {**secrets, **renewal_options(self._lean, secrets)}

    def spec(self) -> URLSpec:
        """This queue by URL with its client's settings (``rebuild.sqs_settings``);
        credentials from the other process's chain (``leasekeeper.backends.spec``)."""
        own: dict[str, Any] = {"client_retries": self.client_retries or None}
        own["max_lease_age"] = self.max_lease_age if self._lease_age_given else None
        own["fast_path"] = None if self.fast_path else False
        return URLSpec.of(self.queue_url, {**sqs_settings(self._client), **own})

    def sibling(self, name: str, *, create: bool = False) -> SQSBackend:
        """The queue ``name`` through the same client (GetQueueUrl; with ``create``,
        CreateQueue, which answers the URL of a queue that exists too)."""
        if create:
            attributes: Any = {"FifoQueue": "true"} if name.endswith(".fifo") else {}
            answer = self.call(
                "CreateQueue",
                lambda: self._client.create_queue(QueueName=name, Attributes=attributes),
            )
        else:
            answer = self.call("GetQueueUrl", lambda: self._client.get_queue_url(QueueName=name))
        return SQSBackend(
            self._client,
            answer["QueueUrl"],
            clock=self.clock,
            client_retries=self.client_retries,
            max_lease_age=self.max_lease_age if self._lease_age_given else None,
            fast_path=self.fast_path,
        )

    def __repr__(self) -> str:
        return f"SQSBackend(queue_url={self.queue_url!r})"

    @property
    def client(self) -> SQSClient:
        return self._client

    @property
    def lean(self) -> LeanPath | None:
        """The lean call path of the hot calls (None: every call goes through the client)."""
        return self._lean

    # ------------------------------------------------------------------ queue settings

    def queue_attributes(self, *, refresh: bool = False) -> Mapping[str, str]:
        """Every attribute of the queue (GetQueueAttributes "All"), read once and
        cached (``refresh=True`` reads them again). A failed read raises
        ``ReceiveError`` (operation "GetQueueAttributes")."""
        if refresh:
            self._attributes.forget()
        return self._attributes.get()

    def _read_attributes(
        self, names: Sequence[Any] = ("All",), operation: str = "GetQueueAttributes"
    ) -> Mapping[str, str]:
        params: Any = {"QueueUrl": self.queue_url, "AttributeNames": list(names)}
        response = self.call(operation, lambda: self._client.get_queue_attributes(**params))
        return {str(k): str(v) for k, v in (response.get("Attributes") or {}).items()}

    def queue_counts(self) -> QueueCounts:
        """ApproximateNumberOfMessages (visible), ...NotVisible (in flight) and
        ...Delayed, read now (GetQueueAttributes; SQS's counts lag up to a minute)."""
        found = self._read_attributes(_COUNTS, "counts")
        return QueueCounts(*(_int_attribute(found, name) for name in _COUNTS))

    def queue_visibility_timeout(self) -> float:
        """The queue's VisibilityTimeout attribute (from ``queue_attributes()``)."""
        value = self.queue_attributes().get("VisibilityTimeout")
        try:
            seconds = float(value) if value is not None else math.nan
        except ValueError:
            seconds = math.nan
        if not 0 <= seconds <= MAX_VISIBILITY:
            raise ReceiveError(
                "retry",
                "no usable VisibilityTimeout in the answer",
                operation="GetQueueAttributes",
                service=self.service,
            )
        return seconds

    def redrive_policy(self) -> Mapping[str, Any] | None:
        """The queue's RedrivePolicy (``deadLetterTargetArn``, ``maxReceiveCount``)
        from ``queue_attributes()``, or None when it has none."""
        text = self.queue_attributes().get("RedrivePolicy")
        return json.loads(text) if text else None

    def _visibility(self, visibility_timeout: float | None) -> float:
        if visibility_timeout is None:
            return self.queue_visibility_timeout()
        return check_seconds("visibility_timeout", visibility_timeout, high=MAX_VISIBILITY)

    # ------------------------------------------------------------------ receiving

    def receive_messages(self, count: int, wait: float, visibility: float | None) -> list[Message]:
        vis = self._visibility(visibility)
        # Both up: a 0.5 s poll is 1 s, not a 0 s busy poll; the real invisibility is
        # never shorter than the one the deadline counts (CloudBackend.receive).
        params: dict[str, Any] = {
            "QueueUrl": self.queue_url,
            "MaxNumberOfMessages": count,
            "WaitTimeSeconds": whole_seconds(wait, up=True),
            "VisibilityTimeout": whole_seconds(vis, up=True),
            "MessageAttributeNames": ["All"],
        }
        if self._system_attribute_names:
            params["MessageSystemAttributeNames"] = ["All"]
        else:  # pragma: no cover - botocore older than MessageSystemAttributeNames
            params["AttributeNames"] = ["All"]
        attempt = self._attempts.take() if self.fifo else None
        if attempt is not None:
            params["ReceiveRequestAttemptId"] = attempt
        # Rule 1: the deadline counts from just before the request is sent.
        received_at = self.clock.now()
        try:
            response = self.call("receive", lambda: self._hot("ReceiveMessage", params))
        except ReceiveError as failed:
            if attempt is not None and failed.kind == "retry":
                self._attempts.failed(attempt)  # the next receive asks again with it
            raise
        messages = [
            self._message(raw, raw, received_at, vis) for raw in response.get("Messages", [])
        ]
        if messages:
            log.debug("received %d message(s) from %s", len(messages), self.queue_url)
        return messages

    def _message(
        self,
        data: Mapping[str, Any],
        raw: Any,
        received_at: float,
        visibility: float,
        deadline_hint: float | None = None,
    ) -> Message:
        _check_received(data)
        body = data["Body"]
        return self.new_message(
            id=str(data["MessageId"]),
            receipt=str(data["ReceiptHandle"]),
            body=body if isinstance(body, (str, bytes)) else str(body),
            raw=raw,
            received_at=received_at,
            visibility=visibility,
            count=_int_attribute(data.get("Attributes"), "ApproximateReceiveCount"),
            attributes=_message_attributes(data),
            deadline_hint=deadline_hint,
            group=_group(data.get("Attributes")),
        )

    def adopt(self, raw: Any, visibility_timeout: float | None = None) -> Message:
        """Lease a message you received yourself, **right after** receiving it: a
        message dict from ``client.receive_message(...)["Messages"]`` or a boto3
        resource ``sqs.Message``. Its deadline counts from now, with
        ``visibility_timeout`` (None: the queue's); the timestamps SQS sent with it
        may only shorten it, and on a first delivery date the 12-hour cap (see
        docs/backends/sqs.md).
        """
        data, raw_obj = _native(raw, self.queue_url)
        visibility = self._visibility(visibility_timeout)
        now = self.clock.now()
        wall = self.clock.wall()
        attributes = data.get("Attributes")
        count = _int_attribute(attributes, "ApproximateReceiveCount")
        first = _int_attribute(attributes, "ApproximateFirstReceiveTimestamp")
        sent = _int_attribute(attributes, "SentTimestamp")

        def local(epoch_ms: int) -> float:
            return now - (wall - epoch_ms / 1000.0)

        received_at = now
        deadline_hint: float | None = None
        if count == 1 and first is not None and local(first) < now:
            # This receive was the first, so its time is known (up to clock skew):
            # the deadline and the cap count from it.
            received_at = local(first)
            deadline_hint = received_at + visibility
        else:
            # Only known to be earlier than this receive: a shorter deadline, kept
            # when it still lies ahead.
            loose = [local(ms) for ms in (first, sent) if ms is not None]
            if loose:
                hint = max(loose) + visibility
                if now < hint < now + visibility:
                    deadline_hint = hint
        message = self._message(data, raw_obj, now, visibility, deadline_hint)
        message.hard_deadline = self.hard_deadline_after(received_at)
        return message

    # ------------------------------------------------------------------ producing

    def send(
        self,
        body: str | bytes,
        attributes: Mapping[str, str] | None = None,
        *,
        delay: float = 0.0,
        group_id: str | None = None,
        deduplication_id: str | None = None,
    ) -> str:
        """SendMessage; returns the new message's id. ``group_id`` (MessageGroupId)
        is required on a FIFO queue, which takes no per-message delay;
        ``deduplication_id`` (MessageDeduplicationId) defaults there to a new one."""
        attrs, seconds = self.send_arguments(body, attributes, delay)
        params: dict[str, Any] = {
            "QueueUrl": self.queue_url,
            "MessageBody": body if isinstance(body, str) else body.decode("utf-8"),
        }
        if attrs:
            params["MessageAttributes"] = {
                name: {"DataType": "String", "StringValue": value} for name, value in attrs.items()
            }
        if self.fifo:
            if not group_id:
                raise ValueError("a FIFO queue needs group_id (its MessageGroupId) for send")
            if seconds:
                raise ValueError("a FIFO queue takes no per-message delay: send with delay=0")
            import uuid  # (here: the renewer process never sends)

            params["MessageDeduplicationId"] = deduplication_id or uuid.uuid4().hex
        elif deduplication_id is not None:
            params["MessageDeduplicationId"] = deduplication_id
        if group_id:
            params["MessageGroupId"] = group_id
        if seconds:
            params["DelaySeconds"] = seconds
        answer = self.call("send", lambda: self._client.send_message(**params))
        return str(answer["MessageId"])

    # ------------------------------------------------------------------ batch operations

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
        entries: list[Any] = [
            {"Id": str(index), "ReceiptHandle": handle.receipt}
            for index, handle in enumerate(handles)
        ]
        name = "DeleteMessageBatch"
        if seconds is not None:
            name = "ChangeMessageVisibilityBatch"
            for entry in entries:
                entry["VisibilityTimeout"] = seconds
        params = {"QueueUrl": self.queue_url, "Entries": entries}
        OWN_CALL.active = not self.client_retries
        try:
            response = self._hot(name, params, retries=self.client_retries)
        finally:
            OWN_CALL.active = False
        return batch_outcomes(self, operation, handles, response)

    def _hot(self, operation: str, params: dict[str, Any], *, retries: bool = True) -> Any:
        """A hot call: through the lean path where it can stand in for the client."""
        lean = self._lean
        if lean is not None and lean.usable():
            return lean.call(operation, params, retries=retries)
        return getattr(self._client, CLIENT_METHODS[operation])(**params)

    # ------------------------------------------------------------------ errors

    def classify(self, exc: BaseException, receipts: Sequence[str] = ()) -> Outcome:
        """``classify_exception``, with ``receipts`` scrubbed out of the detail."""
        kind, detail, _ = classify_with_text(exc)
        return Outcome(kind, detail=scrub(detail, receipts))

    def failure_note(self, exc: BaseException, receipts: Sequence[str]) -> str:
        _, _, text = classify_with_text(exc)
        return said(scrub(text, receipts))


def batch_outcomes(
    backend: SQSBackend, operation: str, handles: Sequence[Handle], answer: Mapping[str, Any]
) -> list[Outcome]:
    """One outcome per handle, in order, from a batch answer's ``Successful`` and
    ``Failed`` entries (their Ids are the handles' indexes); in neither: "retry"."""
    receipts = [handle.receipt for handle in handles]
    found = {str(entry.get("Id")): OK for entry in answer.get("Successful", [])}
    for entry in answer.get("Failed", []):
        entry_id, text = str(entry.get("Id")), str(entry.get("Message", "") or "")
        fault = entry.get("SenderFault")
        kind, detail = classify_error(
            str(entry.get("Code", "") or ""),
            message=text,
            sender_fault=fault if isinstance(fault, bool) else None,
        )
        found[entry_id] = failure = Outcome(kind, detail=scrub(detail, receipts))
        which = [h for i, h in enumerate(handles) if str(i) == entry_id] or handles
        backend.log_failure(operation, which, failure, said(scrub(text, receipts)))
    out = [found.get(str(index), _MISSING) for index in range(len(handles))]
    if _MISSING in out:
        log.warning(
            "%s on %s: %d entries missing from both Successful and Failed; treated as transient",
            operation,
            backend.queue_url,
            out.count(_MISSING),
        )
    return out


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
