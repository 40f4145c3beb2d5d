"""The lean SQS path against botocore on the same bytes.

Each answer below is sent as raw bytes by a loopback server (tests/sqs/raw_server.py)
to one boto3 client twice: once through the client itself (urllib3, botocore's
endpoint, parser and error factory, its after-call handlers) and once through
its lean path (``LeanPath.of(client)``). What a user gets must be the same: the
parsed dict (every key, Binary attributes as bytes, the ResponseMetadata), or
the exception - its class (the client's modeled one), its ``response`` (Error
and ResponseMetadata) and its text. Successes with every attribute type and
non-ASCII text, the errors of docs/backend-semantics.md, and malformed answers
(HTML pages, empty bodies, cut-short JSON, unknown ``__type``, a query-error
header ending in ``;``, ``null`` and ``[]``...). The lean path reads the plain
successes itself and hands everything else to botocore's parser, so both must
agree however the answer looks.

The request side: the same parameters through both paths make requests botocore
would accept as its own - the same headers (User-Agent with the client's extra
and app id, the attempt header), the same signed headers and a signature
botocore's signer makes for the lean request, a body with the same JSON.
"""

from __future__ import annotations

import base64
import datetime
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import boto3
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError
from hypothesis import given, settings
from hypothesis import strategies as st

from leasekeeper.backends.sqs import SQSBackend
from leasekeeper.backends.sqs.lean import CLIENT_METHODS, LeanPath
from leasekeeper.backends.sqs.responses import OUTPUT_SHAPES
from tests.sqs.raw_server import RawServer, header, http_answer

REGION = "eu-west-1"
JSON_TYPE = ("Content-Type: application/x-amz-json-1.0",)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# every MessageAttribute type SQS knows, custom types and non-ASCII text included
ATTRIBUTES: dict[str, Any] = {
    "s": {"StringValue": "ünïcödé ✓ 🚀", "DataType": "String"},
    "n": {"StringValue": "3.14159", "DataType": "Number.float"},
    "i": {"StringValue": "-42", "DataType": "Number"},
    "b": {"BinaryValue": b64(b"\x00\x01\xff"), "DataType": "Binary"},
    "png": {"BinaryValue": b64(b"\x89PNG\r\n\x1a\n"), "DataType": "Binary.png"},
    "j": {"StringValue": '{"a": [1, "é"]}', "DataType": "String.json"},
    "sl": {"StringListValues": ["a", "ö"], "DataType": "String"},
    "bl": {"BinaryListValues": [b64(b"\x00"), b64(b"\xfe\xff")], "DataType": "Binary"},
}
SYSTEM = {
    "SenderId": "AIDAEXAMPLE",
    "ApproximateFirstReceiveTimestamp": "1764633600123",
    "ApproximateReceiveCount": "2",
    "SentTimestamp": "1764633600000",
    "MessageGroupId": "group-ä",
    "MessageDeduplicationId": "dedup",
    "SequenceNumber": "18889912345678901234",
    "AWSTraceHeader": "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1",
}


def message(n: int = 0, **extra: Any) -> dict[str, Any]:
    return {
        "MessageId": f"0d6a3b4e-0000-4000-8000-00000000000{n}",
        "ReceiptHandle": "AQEB" + "x" * 300 + str(n),
        "MD5OfBody": "5d41402abc4b2a76b9719d911017c592",
        "Body": f"héllo wörld ✓ 🚀 {n}",
        "Attributes": dict(SYSTEM),
        "MD5OfMessageAttributes": "2fd8e8c1f4a7e5b2fdbd1a0d6c2f7b3e",
        "MessageAttributes": dict(ATTRIBUTES),
        **extra,
    }


def ok(body: bytes | str, *headers: str) -> bytes:
    data = body.encode() if isinstance(body, str) else body
    return http_answer(data, "200 OK", headers or JSON_TYPE)


def error(
    status: str,
    type_: str | None,
    message: str | None = "Something went wrong.",
    query_error: str | None = None,
    *,
    body: bytes | None = None,
    message_key: str = "message",
) -> bytes:
    if body is None:
        found: dict[str, Any] = {}
        if type_ is not None:
            found["__type"] = type_
        if message is not None:
            found[message_key] = message
        body = json.dumps(found).encode()
    headers = [*JSON_TYPE]
    if query_error is not None:
        headers.append(f"x-amzn-query-error: {query_error}")
    return http_answer(body, status, tuple(headers))


SQS = "com.amazonaws.sqs#"
RECEIVE = "ReceiveMessage"
CHANGE = "ChangeMessageVisibilityBatch"
DELETE = "DeleteMessageBatch"

# (case, operation, the answer's bytes)
SUCCESSES: list[tuple[str, str, bytes]] = [
    ("empty-object", RECEIVE, ok("{}")),
    ("no-messages", RECEIVE, ok('{"Messages":[]}')),
    ("every-attribute-type", RECEIVE, ok(json.dumps({"Messages": [message(0), message(1)]}))),
    (
        "utf-8-unescaped",
        RECEIVE,
        ok(json.dumps({"Messages": [message(2)]}, ensure_ascii=False).encode("utf-8")),
    ),
    (
        "only-system-attributes",
        RECEIVE,
        ok(json.dumps({"Messages": [message(3, MessageAttributes={})]})),
    ),
    (
        "a-member-unknown-to-botocore",
        RECEIVE,
        ok(json.dumps({"Messages": [message(4, FutureField="x")], "NextToken": "t"})),
    ),
    ("a-null-body", RECEIVE, ok(json.dumps({"Messages": [message(5, Body=None)]}))),
    ("a-null-list-item", RECEIVE, ok(json.dumps({"Messages": [None, message(6)]}))),
    ("null-messages", RECEIVE, ok('{"Messages":null}')),
    (
        "a-null-attribute",
        RECEIVE,
        ok(json.dumps({"Messages": [message(7, MessageAttributes={"x": None})]})),
    ),
    (
        "invalid-base64",
        RECEIVE,
        ok(
            json.dumps(
                {
                    "Messages": [
                        message(
                            8, MessageAttributes={"b": {"BinaryValue": "%%%", "DataType": "Binary"}}
                        )
                    ]
                }
            )
        ),
    ),
    ("truncated-json", RECEIVE, ok('{"Messages":[{"MessageId":"a"')),
    ("html-on-200", RECEIVE, ok("<html><body>OK</body></html>", "Content-Type: text/html")),
    ("empty-200", RECEIVE, ok(b"")),
    ("null-200", RECEIVE, ok("null")),
    ("list-200", RECEIVE, ok("[]")),
    ("string-200", RECEIVE, ok('"Messages"')),
    ("messages-not-a-list", RECEIVE, ok('{"Messages":{"a":1}}')),
    ("invalid-utf-8", RECEIVE, ok(b'{"Messages":[{"Body":"\xff\xfe"}]}')),
    ("batch-all-ok", DELETE, ok('{"Successful":[{"Id":"0"},{"Id":"1"}],"Failed":[]}')),
    (
        "batch-failed-entries",
        CHANGE,
        ok(
            json.dumps(
                {
                    "Successful": [{"Id": "0"}],
                    "Failed": [
                        {
                            "Id": "1",
                            "SenderFault": True,
                            "Code": "ReceiptHandleIsInvalid",
                            "Message": "The input receipt handle is invalid.",
                        },
                        {"Id": "2", "SenderFault": False, "Code": "InternalError", "Message": "é"},
                    ],
                }
            )
        ),
    ),
    ("batch-unknown-member", DELETE, ok('{"Successful":[{"Id":"0","Extra":1}],"Failed":[]}')),
    ("batch-empty", CHANGE, ok("{}")),
    ("batch-html", DELETE, ok("<html></html>", "Content-Type: text/html")),
    ("status-201", DELETE, http_answer(b'{"Successful":[{"Id":"0"}]}', "201 Created", JSON_TYPE)),
    (
        "status-300",
        DELETE,
        http_answer(b'{"Successful":[{"Id":"0"}]}', "300 Multiple Choices", JSON_TYPE),
    ),
    (
        "no-request-id",
        RECEIVE,
        http_answer(b'{"Messages":[]}', "200 OK", JSON_TYPE, request_id=None),
    ),
]

NOT_AVAILABLE = (
    "Value AQEBxxxx for parameter ReceiptHandle is invalid. Reason: Message does not exist "
    "or is not available for visibility timeout change."
)
ERRORS: list[tuple[str, str, bytes]] = [
    # the real service's error shapes (docs/backend-semantics.md)
    (
        "receipt-invalid",
        CHANGE,
        error(
            "404 Not Found",
            SQS + "ReceiptHandleIsInvalid",
            "The input receipt handle is invalid.",
            "ReceiptHandleIsInvalid;Sender",
        ),
    ),
    (
        "not-inflight",
        CHANGE,
        error(
            "400 Bad Request",
            SQS + "MessageNotInflight",
            "The message referred to isn't in flight.",
            "AWS.SimpleQueueService.MessageNotInflight;Sender",
        ),
    ),
    (
        "invalid-parameter",
        CHANGE,
        error("400 Bad Request", SQS + "InvalidParameterValue", NOT_AVAILABLE),
    ),
    (
        "invalid-parameter-qc",
        DELETE,
        error(
            "400 Bad Request",
            SQS + "InvalidParameterValue",
            "The receipt handle has expired.",
            "InvalidParameterValue;Sender",
        ),
    ),
    (
        "queue-does-not-exist",
        RECEIVE,
        error(
            "400 Bad Request",
            SQS + "QueueDoesNotExist",
            "The specified queue does not exist.",
            "AWS.SimpleQueueService.NonExistentQueue;Sender",
        ),
    ),
    (
        "access-denied",
        RECEIVE,
        error(
            "403 Forbidden",
            "com.amazon.coral.service#AccessDeniedException",
            "User is not authorized.",
            "AccessDenied;Sender",
        ),
    ),
    (
        "unrecognized-client",
        RECEIVE,
        error(
            "400 Bad Request",
            "com.amazon.coral.service#UnrecognizedClientException",
            "The security token included in the request is invalid.",
            "InvalidClientTokenId;Sender",
        ),
    ),
    (
        "signature",
        DELETE,
        error(
            "400 Bad Request",
            "com.amazon.coral.service#InvalidSignatureException",
            "The request signature we calculated does not match.",
            "SignatureDoesNotMatch;Sender",
        ),
    ),
    (
        "throttled",
        RECEIVE,
        error(
            "400 Bad Request", SQS + "RequestThrottled", "Rate exceeded.", "RequestThrottled;Sender"
        ),
    ),
    (
        "throttling-exception",
        DELETE,
        error(
            "400 Bad Request",
            "com.amazon.coral.availability#ThrottlingException",
            "Rate exceeded",
            "Throttling;Sender",
        ),
    ),
    (
        "kms-throttled",
        RECEIVE,
        error(
            "400 Bad Request",
            SQS + "KmsThrottled",
            "KMS throttled.",
            "KMS.ThrottlingException;Sender",
        ),
    ),
    (
        "unavailable",
        RECEIVE,
        error(
            "503 Service Unavailable",
            SQS + "ServiceUnavailable",
            "Service is unavailable.",
            "ServiceUnavailable;Receiver",
        ),
    ),
    (
        "internal-error",
        DELETE,
        error(
            "500 Internal Server Error",
            SQS + "InternalError",
            "We encountered an internal error.",
            "InternalError;Receiver",
        ),
    ),
    (
        "too-many-entries",
        CHANGE,
        error(
            "400 Bad Request",
            SQS + "TooManyEntriesInBatchRequest",
            "Maximum number of entries per request are 10.",
            "AWS.SimpleQueueService.TooManyEntriesInBatchRequest;Sender",
        ),
    ),
    (
        "empty-batch",
        DELETE,
        error(
            "400 Bad Request",
            SQS + "EmptyBatchRequest",
            "There should be at least one entry.",
            "AWS.SimpleQueueService.EmptyBatchRequest;Sender",
        ),
    ),
    (
        "ids-not-distinct",
        DELETE,
        error(
            "400 Bad Request",
            SQS + "BatchEntryIdsNotDistinct",
            "Id 0 repeated.",
            "AWS.SimpleQueueService.BatchEntryIdsNotDistinct;Sender",
        ),
    ),
    (
        "invalid-batch-id",
        CHANGE,
        error(
            "400 Bad Request",
            SQS + "InvalidBatchEntryId",
            "Bad id.",
            "AWS.SimpleQueueService.InvalidBatchEntryId;Sender",
        ),
    ),
    (
        "capital-message",
        CHANGE,
        error("400 Bad Request", SQS + "InvalidParameterValue", "Upper.", message_key="Message"),
    ),
    # malformed and unusual answers
    (
        "html-503",
        RECEIVE,
        error(
            "503 Service Unavailable",
            None,
            body=b"<html><body><h1>503 Service Unavailable</h1></body></html>",
        ),
    ),
    (
        "html-502-leading-space",
        DELETE,
        error("502 Bad Gateway", None, body=b"  <html>Bad Gateway</html>"),
    ),
    (
        "html-400",
        RECEIVE,
        error("400 Bad Request", None, body=b"<html><body>Bad Request</body></html>"),
    ),
    ("empty-500", RECEIVE, error("500 Internal Server Error", None, body=b"")),
    ("empty-400", CHANGE, error("400 Bad Request", None, body=b"")),
    (
        "truncated-json-400",
        DELETE,
        error("400 Bad Request", None, body=b'{"__type":"com.amazonaws.sqs#Inter'),
    ),
    (
        "unknown-type",
        RECEIVE,
        error("400 Bad Request", SQS + "SomethingNew", "New.", "SomethingNew;Sender"),
    ),
    (
        "query-error-ends-in-semicolon",
        RECEIVE,
        error(
            "400 Bad Request",
            SQS + "QueueDoesNotExist",
            "Gone.",
            "AWS.SimpleQueueService.NonExistentQueue;",
        ),
    ),
    (
        "query-error-three-parts",
        CHANGE,
        error("400 Bad Request", SQS + "InvalidParameterValue", "x", "A;B;C"),
    ),
    (
        "query-error-empty-code",
        CHANGE,
        error("400 Bad Request", SQS + "InvalidParameterValue", "x", ";Sender"),
    ),
    ("empty-type", DELETE, error("400 Bad Request", "", "Empty type.")),
    (
        "type-with-colon",
        RECEIVE,
        error(
            "400 Bad Request",
            "QueueDoesNotExist:http://internal.amazon.com/coral/com.amazonaws.sqs/",
            "Gone.",
        ),
    ),
    ("no-type", RECEIVE, error("400 Bad Request", None, "No type at all.")),
    (
        "no-message",
        CHANGE,
        error("400 Bad Request", SQS + "InternalError", None, "InternalError;Receiver"),
    ),
    ("null-400", RECEIVE, error("400 Bad Request", None, body=b"null")),
    ("list-400", DELETE, error("400 Bad Request", None, body=b"[]")),
    ("text-403", RECEIVE, error("403 Forbidden", None, body=b"Forbidden")),
    (
        "redirect-301",
        RECEIVE,
        http_answer(b"", "301 Moved Permanently", ("Location: http://elsewhere/",)),
    ),
    ("not-found-404-html", DELETE, error("404 Not Found", None, body=b"<html>Not Found</html>")),
]

PARAMS: dict[str, dict[str, Any]] = {
    RECEIVE: {
        "MaxNumberOfMessages": 10,
        "WaitTimeSeconds": 0,
        "VisibilityTimeout": 30,
        "MessageAttributeNames": ["All"],
        "MessageSystemAttributeNames": ["All"],
    },
    CHANGE: {
        "Entries": [
            {"Id": str(i), "ReceiptHandle": f"AQEB{i}" + "r" * 200, "VisibilityTimeout": 30}
            for i in range(3)
        ]
    },
    DELETE: {"Entries": [{"Id": "0", "ReceiptHandle": "AQEB0" + "r" * 200}]},
}


def client_for(url: str, **config: Any) -> Any:
    settings_given: dict[str, Any] = {"retries": {"total_max_attempts": 1, "mode": "standard"}}
    settings_given.update(config)
    return boto3.client(
        "sqs",
        endpoint_url=url,
        region_name=REGION,
        aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key="wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
        config=Config(**settings_given),
    )


@pytest.fixture(scope="module")
def server() -> Iterator[RawServer]:
    with RawServer() as made:
        yield made


def outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    """What a user sees of a call: its answer, or its exception's class, response and text."""
    try:
        return ("answer", call())
    except ClientError as exc:
        return ("ClientError", type(exc), exc.response, str(exc))
    except Exception as exc:
        return ("raised", type(exc), str(exc))


def both(server: RawServer, client: Any, operation: str, answer: bytes) -> list[tuple[Any, ...]]:
    """The same answer through the client, then through its lean path."""
    lean = LeanPath.of(client)
    params = {"QueueUrl": f"{server.url}/123456789012/jobs", **PARAMS[operation]}
    seen = []
    for call in (
        lambda: getattr(client, CLIENT_METHODS[operation])(**params),
        lambda: lean.call(operation, params),
    ):
        server.answer(answer)
        seen.append(outcome(call))
    return seen


@pytest.mark.parametrize(
    ("operation", "answer"),
    [pytest.param(op, answer, id=case) for case, op, answer in SUCCESSES + ERRORS],
)
def test_the_lean_path_reads_an_answer_as_the_client_does(
    server: RawServer, operation: str, answer: bytes
) -> None:
    client_seen, lean_seen = both(server, client_for(server.url), operation, answer)
    assert lean_seen == client_seen


def test_the_modeled_exception_class_is_the_clients(server: RawServer) -> None:
    client = client_for(server.url)
    answer = next(a for case, _, a in ERRORS if case == "queue-does-not-exist")
    client_seen, lean_seen = both(server, client, RECEIVE, answer)
    assert lean_seen[1] is client_seen[1] is client.exceptions.QueueDoesNotExist


def test_binary_attributes_are_bytes_as_through_the_client(server: RawServer) -> None:
    """Through SQSBackend on both paths: message.raw is the client's message dict."""
    client = client_for(server.url)
    url = f"{server.url}/123456789012/jobs"
    answer = ok(json.dumps({"Messages": [message(0)]}))
    raws = []
    for fast_path in (True, False):
        backend = SQSBackend(client, url, fast_path=fast_path)
        server.answer(answer)
        [received] = backend.receive(max_messages=10, visibility_timeout=30)
        raws.append(received.raw)
        assert received.attributes == {
            "s": "ünïcödé ✓ 🚀",
            "n": "3.14159",
            "i": "-42",
            "j": '{"a": [1, "é"]}',
        }
    assert raws[0] == raws[1]
    assert raws[0]["MessageAttributes"]["b"]["BinaryValue"] == b"\x00\x01\xff"
    assert raws[0]["MessageAttributes"]["bl"]["BinaryListValues"] == [b"\x00", b"\xfe\xff"]


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
_attribute = st.one_of(
    st.builds(
        lambda v, t: {"StringValue": v, "DataType": t},
        _text,
        st.sampled_from(["String", "Number", "String.x"]),
    ),
    st.builds(
        lambda v, t: {"BinaryValue": b64(v), "DataType": t},
        st.binary(max_size=20),
        st.sampled_from(["Binary", "Binary.y"]),
    ),
)
_message = st.fixed_dictionaries(
    {"MessageId": _text, "ReceiptHandle": _text, "Body": _text, "MD5OfBody": _text},
    optional={
        "Attributes": st.dictionaries(_text, _text, max_size=4),
        "MessageAttributes": st.dictionaries(_text, _attribute, max_size=4),
        "MD5OfMessageAttributes": _text,
    },
)


@settings(max_examples=40, deadline=None)
@given(messages=st.lists(_message, max_size=4), ascii_only=st.booleans())
def test_any_plain_receive_answer_reads_the_same(
    messages: list[dict[str, Any]], ascii_only: bool
) -> None:
    with RawServer() as server:
        body = json.dumps({"Messages": messages}, ensure_ascii=ascii_only).encode()
        client_seen, lean_seen = both(server, client_for(server.url), RECEIVE, ok(body))
    assert lean_seen == client_seen


def test_the_answer_shapes_are_botocores() -> None:
    """responses.OUTPUT_SHAPES, written out so that reading needs no botocore, is the
    service model's."""
    model = boto3.client("sqs", region_name=REGION).meta.service_model

    def written(shape: Any) -> Any:
        if shape is None:
            return None
        if shape.type_name == "structure":
            return {
                member.serialization.get("name", name): written(member)
                for name, member in shape.members.items()
            }
        if shape.type_name == "list":
            return ("list", written(shape.member))
        if shape.type_name == "map":
            assert shape.key.type_name == "string"
            return ("map", written(shape.value))
        return "blob" if shape.type_name == "blob" else "string"

    for operation, shape in OUTPUT_SHAPES.items():
        assert written(model.operation_model(operation).output_shape) == shape, operation


# ---------------------------------------------------------------------- the requests


def signed_again(lines: list[str], body: bytes, url: str) -> str:
    """The Authorization botocore's SigV4 signer makes for a captured request, at
    the time the request says it was signed."""
    headers = {
        name: header(lines, name) or ""
        for name in ("Content-Type", "X-Amz-Target", "x-amzn-query-mode")
    }
    when = datetime.datetime.strptime(str(header(lines, "X-Amz-Date")), "%Y%m%dT%H%M%SZ")
    request = AWSRequest(method="POST", url=url, data=body, headers=headers)
    credentials = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    with mock.patch("botocore.auth.get_current_datetime", return_value=when):
        SigV4Auth(credentials, "sqs", REGION).add_auth(request)
    return str(request.headers["Authorization"])


@pytest.mark.parametrize("operation", [RECEIVE, CHANGE, DELETE])
def test_the_lean_request_is_one_botocore_sends(server: RawServer, operation: str) -> None:
    client = client_for(
        server.url,
        user_agent_extra="my-app/2.0 (billing)",
        user_agent_appid="jobs-worker",
    )
    both(server, client, operation, ok("{}"))
    (client_lines, client_body), (lean_lines, lean_body) = server.requests[-2:]
    names = {line.split(":", 1)[0].lower() for line in client_lines[1:]}
    assert {line.split(":", 1)[0].lower() for line in lean_lines[1:]} == names
    assert client_lines[0] == lean_lines[0] == "POST / HTTP/1.1"
    for name in names - {"x-amz-date", "authorization", "amz-sdk-invocation-id", "content-length"}:
        assert header(lean_lines, name) == header(client_lines, name), name
    user_agent = str(header(lean_lines, "User-Agent"))
    assert "my-app/2.0 (billing)" in user_agent and "app/jobs-worker" in user_agent
    assert header(lean_lines, "amz-sdk-request") == "attempt=1; max=1"
    assert uuid.UUID(str(header(lean_lines, "amz-sdk-invocation-id"))).version == 4
    assert json.loads(lean_body) == json.loads(client_body)
    assert header(lean_lines, "Content-Length") == str(len(lean_body))
    client_auth, lean_auth = (
        str(header(lines, "Authorization")) for lines in (client_lines, lean_lines)
    )
    assert lean_auth.split("Signature=")[0] == client_auth.split("Signature=")[0]
    assert lean_auth == signed_again(lean_lines, lean_body, server.url)
