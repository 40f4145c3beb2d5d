"""Error mapping of SQSBackend, proved with the real service's error responses
(code, query code, message, HTTP status), whole-call and per entry, on both call
paths: botocore's Stubber for the client, a loopback server speaking SQS's JSON
protocol for the lean path (``answers``, tests/sqs/stubbed.py).

Several rows are exactly where moto answers differently from SQS (see
docs/backends/sqs.md, "moto"): moto cannot produce them, so they are stubbed here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import (
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
)

from leasekeeper.backends.sqs import SQSBackend, classify_error
from tests.sqs.stubbed import (
    FIFO_URL,
    QUEUE_URL,
    REGION,
    Answers,
    change_entries,
    delete_entries,
    handles,
    receipt,
)

RH = receipt()  # quoted by some messages below; must never come out of the backend

NOT_AVAILABLE = (
    f"Value {RH} for parameter ReceiptHandle is invalid. Reason: Message does not exist "
    "or is not available for visibility timeout change."
)
BEYOND_LIMIT = (
    "Value 43200 for parameter VisibilityTimeout is invalid. Reason: Total VisibilityTimeout "
    "for the message is beyond the limit [43200 seconds]"
)
FIFO_EXPIRED = (
    f"Value {RH} for parameter ReceiptHandle is invalid. Reason: The receipt handle has expired."
)
INVALID_HANDLE = f'The input receipt handle "{RH}" is not a valid receipt handle.'

# (case, Error.Code, Error.QueryErrorCode, Error.Message, HTTP status, outcome kind)
WHOLE_CALL: list[tuple[str, str, str | None, str, int, str]] = [
    (
        "receipt-invalid",
        "ReceiptHandleIsInvalid",
        "ReceiptHandleIsInvalid",
        INVALID_HANDLE,
        404,
        "lost",
    ),
    (
        "not-inflight",
        "AWS.SimpleQueueService.MessageNotInflight",
        "MessageNotInflight",
        "The message referred to isn't in flight.",
        400,
        "lost",
    ),
    # moto answers ReceiptHandleIsInvalid for a deleted message; SQS answers this:
    ("not-available", "InvalidParameterValue", None, NOT_AVAILABLE, 400, "lost"),
    (
        "not-available-qc",
        "InvalidParameterValue",
        "InvalidParameterValue",
        NOT_AVAILABLE,
        400,
        "lost",
    ),
    # moto counts 12 h from SentTimestamp; SQS from the receive that issued the handle:
    ("capped", "InvalidParameterValue", None, BEYOND_LIMIT, 400, "capped"),
    ("capped-qc", "InvalidParameterValue", "InvalidParameterValue", BEYOND_LIMIT, 400, "capped"),
    # moto deletes with an expired FIFO handle; SQS refuses:
    ("fifo-expired", "InvalidParameterValue", None, FIFO_EXPIRED, 400, "lost"),
    (
        "other-invalid-parameter",
        "InvalidParameterValue",
        None,
        "Value 50000 for parameter VisibilityTimeout is invalid. "
        "Reason: Must be between 0 and 43200.",
        400,
        "fatal",
    ),
    ("throttled", "RequestThrottled", "RequestThrottled", "Rate exceeded", 400, "retry"),
    ("throttling", "ThrottlingException", "ThrottlingException", "Rate exceeded", 400, "retry"),
    (
        "unavailable",
        "ServiceUnavailable",
        "ServiceUnavailable",
        "Service is unable to handle request.",
        503,
        "retry",
    ),
    (
        "internal-error",
        "InternalError",
        "InternalError",
        "We encountered an internal error. Please try again.",
        500,
        "retry",
    ),
    ("internal-failure", "InternalFailure", "InternalFailure", "", 500, "retry"),
    ("unknown-5xx", "BadGateway", None, "", 502, "retry"),
    ("unknown-4xx", "SomethingNewInTheApi", None, "", 400, "retry"),
    (
        "non-existent-queue",
        "AWS.SimpleQueueService.NonExistentQueue",
        "QueueDoesNotExist",
        "The specified queue does not exist.",
        400,
        "fatal",
    ),
    (
        "queue-does-not-exist",
        "QueueDoesNotExist",
        None,
        "The specified queue does not exist.",
        400,
        "fatal",
    ),
    (
        "access-denied",
        "AccessDenied",
        "AccessDeniedException",
        "User: arn:aws:iam::123456789012:user/w is not authorized to perform: "
        "sqs:changemessagevisibility on resource: arn:aws:sqs:us-east-1:123456789012:jobs",
        403,
        "fatal",
    ),
    (
        "invalid-token",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "The security token included in the request is invalid.",
        403,
        "fatal",
    ),
    (
        "bad-signature",
        "SignatureDoesNotMatch",
        "InvalidSignatureException",
        "The request signature we calculated does not match the signature you provided.",
        403,
        "fatal",
    ),
    (
        "too-many-entries",
        "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
        "TooManyEntriesInBatchRequest",
        "Maximum number of entries per request are 10. You have sent 11.",
        400,
        "fatal",
    ),
    (
        "ids-not-distinct",
        "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
        "BatchEntryIdsNotDistinct",
        "Id 0 repeated.",
        400,
        "fatal",
    ),
    (
        "empty-batch",
        "AWS.SimpleQueueService.EmptyBatchRequest",
        "EmptyBatchRequest",
        "There should be at least one ChangeMessageVisibilityBatchRequestEntry in the request.",
        400,
        "fatal",
    ),
    (
        "invalid-entry-id",
        "AWS.SimpleQueueService.InvalidBatchEntryId",
        "InvalidBatchEntryId",
        "A batch entry id can only contain alphanumeric characters, hyphens and underscores.",
        400,
        "fatal",
    ),
]

# (case, Failed[].Code, Failed[].Message, SenderFault, outcome kind)
PER_ENTRY: list[tuple[str, str, str, bool, str]] = [
    ("receipt-invalid", "ReceiptHandleIsInvalid", INVALID_HANDLE, True, "lost"),
    (
        "not-inflight",
        "MessageNotInflight",
        "The message referred to isn't in flight.",
        True,
        "lost",
    ),
    (
        "not-inflight-legacy",
        "AWS.SimpleQueueService.MessageNotInflight",
        "The message referred to isn't in flight.",
        True,
        "lost",
    ),
    ("not-available", "InvalidParameterValue", NOT_AVAILABLE, True, "lost"),
    ("capped", "InvalidParameterValue", BEYOND_LIMIT, True, "capped"),
    ("fifo-expired", "InvalidParameterValue", FIFO_EXPIRED, True, "lost"),
    ("throttled", "RequestThrottled", "Rate exceeded", True, "retry"),
    ("internal-error", "InternalError", "We encountered an internal error.", False, "retry"),
    ("unavailable", "ServiceUnavailable", "", False, "retry"),
    ("unknown-server-fault", "SomethingNewInTheApi", "", False, "retry"),
    ("unknown-sender-fault", "SomethingNewInTheApi", "", True, "retry"),
    ("access-denied", "AccessDenied", "Access to the resource is denied.", True, "fatal"),
    (
        "non-existent-queue",
        "AWS.SimpleQueueService.NonExistentQueue",
        "The specified queue does not exist.",
        True,
        "fatal",
    ),
]


def _ids(rows: list[Any]) -> list[str]:
    return [row[0] for row in rows]


@pytest.fixture(params=["boto3", "lean"])
def answers(request: pytest.FixtureRequest) -> Iterator[Answers]:
    """Recorded answers on each call path; ``answers.backend`` on QUEUE_URL."""
    made = Answers(request.param)
    yield made
    made.close()


@pytest.fixture(params=["boto3", "lean"])
def fifo_answers(request: pytest.FixtureRequest) -> Iterator[Answers]:
    made = Answers(request.param, FIFO_URL)
    yield made
    made.close()


@pytest.mark.parametrize("row", WHOLE_CALL, ids=_ids(WHOLE_CALL))
@pytest.mark.parametrize("operation", ["extend", "release", "delete"])
def test_whole_call_error_maps_to_outcome(
    caplog: pytest.LogCaptureFixture,
    answers: Answers,
    operation: str,
    row: tuple[str, str, str | None, str, int, str],
) -> None:
    _, code, query_code, message, status, kind = row
    caplog.set_level(logging.DEBUG, logger="leasekeeper")
    backend = answers.backend
    method = "delete_message_batch" if operation == "delete" else "change_message_visibility_batch"
    answers.error(method, code=code, query_code=query_code, message=message, status=status)
    batch = handles(1)
    if operation == "extend":
        outcomes = backend.extend(batch, 30)
    elif operation == "release":
        outcomes = backend.release(batch, 0)
    else:
        outcomes = backend.delete(batch)
    answers.done()
    assert [o.kind for o in outcomes] == [kind]
    detail = outcomes[0].detail
    assert code in detail  # the code is named ...
    assert RH not in detail and batch[0].receipt not in detail  # ... never the receipt
    assert "is not a valid receipt handle" not in detail  # nor the message text
    if kind == "fatal" and "Batch" in code:
        assert "bug" in detail
    assert RH not in caplog.text and batch[0].receipt not in caplog.text
    assert RH not in repr(outcomes)


@pytest.mark.parametrize("row", PER_ENTRY, ids=_ids(PER_ENTRY))
@pytest.mark.parametrize("operation", ["extend", "release", "delete"])
def test_failed_entry_maps_to_outcome_in_handle_order(
    caplog: pytest.LogCaptureFixture,
    answers: Answers,
    operation: str,
    row: tuple[str, str, str, bool, str],
) -> None:
    _, code, message, sender_fault, kind = row
    caplog.set_level(logging.DEBUG, logger="leasekeeper")
    backend = answers.backend
    batch = handles(3)
    # The middle entry fails; Successful lists the others out of order.
    response = {
        "Successful": [{"Id": "2"}, {"Id": "0"}],
        "Failed": [{"Id": "1", "Code": code, "Message": message, "SenderFault": sender_fault}],
    }
    if operation == "delete":
        answers.response(
            "delete_message_batch",
            response,
            {"QueueUrl": backend.queue_url, "Entries": delete_entries(batch)},
        )
        outcomes = backend.delete(batch)
    elif operation == "extend":
        answers.response(
            "change_message_visibility_batch",
            response,
            {"QueueUrl": backend.queue_url, "Entries": change_entries(batch, 30)},
        )
        outcomes = backend.extend(batch, 30)
    else:
        answers.response(
            "change_message_visibility_batch",
            response,
            {"QueueUrl": backend.queue_url, "Entries": change_entries(batch, 5)},
        )
        outcomes = backend.release(batch, 5)
    answers.done()
    assert [o.kind for o in outcomes] == ["ok", kind, "ok"]
    assert code in outcomes[1].detail
    for handle in batch:
        assert handle.receipt not in repr(outcomes) and handle.receipt not in caplog.text
    assert RH not in outcomes[1].detail and RH not in caplog.text


def test_fifo_delete_with_expired_handle_is_lost(fifo_answers: Answers) -> None:
    # moto deletes the message; SQS refuses an expired FIFO handle (per entry).
    backend = fifo_answers.backend
    batch = handles(1)
    fifo_answers.response(
        "delete_message_batch",
        {
            "Successful": [],
            "Failed": [
                {
                    "Id": "0",
                    "Code": "InvalidParameterValue",
                    "Message": FIFO_EXPIRED,
                    "SenderFault": True,
                }
            ],
        },
    )
    [outcome] = backend.delete(batch)
    assert outcome.kind == "lost" and "expired" in outcome.detail


def test_entry_missing_from_response_is_retried(answers: Answers) -> None:
    backend = answers.backend
    answers.response("change_message_visibility_batch", {"Successful": [{"Id": "0"}], "Failed": []})
    assert [o.kind for o in backend.extend(handles(2), 30)] == ["ok", "retry"]


@pytest.mark.parametrize(
    ("code", "message", "kind"),
    [
        ("ReceiptHandleIsInvalid", INVALID_HANDLE, "lost"),
        ("InvalidParameterValue", BEYOND_LIMIT, "capped"),
    ],
)
def test_whole_call_receipt_error_on_a_batch_is_resolved_entry_by_entry(
    answers: Answers, code: str, message: str, kind: str
) -> None:
    # A whole-call answer about "the" receipt says nothing of which entry: each is
    # asked again on its own (a batch of one), and only the guilty one is ended.
    backend = answers.backend
    batch = handles(3)
    answers.error(
        "change_message_visibility_batch",
        code=code,
        query_code=code,
        message=message,
        status=400,
    )
    answers.response(
        "change_message_visibility_batch",
        {"Successful": [{"Id": "0"}], "Failed": []},
        {"QueueUrl": backend.queue_url, "Entries": change_entries(batch[:1], 30)},
    )
    answers.error(
        "change_message_visibility_batch",
        code=code,
        query_code=code,
        message=message,
        status=400,
    )
    answers.response(
        "change_message_visibility_batch",
        {"Successful": [{"Id": "0"}], "Failed": []},
        {"QueueUrl": backend.queue_url, "Entries": change_entries(batch[2:], 30)},
    )
    assert [o.kind for o in backend.extend(batch, 30)] == ["ok", kind, "ok"]
    answers.done()


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (EndpointConnectionError(endpoint_url="https://sqs.us-east-1.amazonaws.com/"), "retry"),
        (ConnectTimeoutError(endpoint_url="https://sqs.us-east-1.amazonaws.com/"), "retry"),
        (ReadTimeoutError(endpoint_url="https://sqs.us-east-1.amazonaws.com/"), "retry"),
        (ConnectionClosedError(endpoint_url="https://sqs.us-east-1.amazonaws.com/"), "retry"),
        (NoCredentialsError(), "fatal"),
        (
            ParamValidationError(report=f"Invalid type for parameter ReceiptHandle, value: {RH}"),
            "fatal",
        ),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else str(value),
)
@pytest.mark.parametrize("operation", ["extend", "release", "delete"])
def test_botocore_exceptions_map_to_outcomes(
    caplog: pytest.LogCaptureFixture, operation: str, exc: Exception, kind: str
) -> None:
    caplog.set_level(logging.DEBUG, logger="leasekeeper")
    client = boto3.client(
        "sqs", region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing"
    )
    backend = SQSBackend(client, QUEUE_URL)

    def fail(**_: Any) -> None:
        raise exc

    client.meta.events.register("before-call.sqs.*", fail)
    batch = handles(2)
    if operation == "extend":
        outcomes = backend.extend(batch, 30)
    elif operation == "release":
        outcomes = backend.release(batch, 0)
    else:
        outcomes = backend.delete(batch)
    assert [o.kind for o in outcomes] == [kind, kind]
    assert type(exc).__name__ in outcomes[0].detail
    assert RH not in outcomes[0].detail and RH not in caplog.text


def test_classify_error_prefers_any_known_code() -> None:
    # Code (legacy) or QueryErrorCode (short) alone is enough.
    assert classify_error("AWS.SimpleQueueService.NonExistentQueue")[0] == "fatal"
    assert classify_error("", "QueueDoesNotExist")[0] == "fatal"
    assert classify_error("", "", "", status=503)[0] == "retry"
    # A code that is not code-shaped is not repeated in the detail.
    kind, detail = classify_error(f"weird {RH}", "", "", status=400)
    assert kind == "retry" and RH not in detail
