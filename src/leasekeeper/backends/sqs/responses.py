"""The lean path's answers, read as botocore reads them.

An SQS answer that keeps to its operation's output shape - every key a member,
no ``null``, containers where the shape has them - is read here: the JSON
decoded, ``Binary`` values (``BinaryValue``, ``BinaryListValues``) decoded from
base64 into bytes as botocore's parser decodes blobs, and the
``ResponseMetadata`` botocore adds (``RequestId``, ``HTTPStatusCode``,
``HTTPHeaders``, ``RetryAttempts``). That is the same dict botocore's parser
makes of the same bytes (tests/sqs/test_differential.py feeds the same bytes to
both). Anything else - an error answer, an unknown key, a ``null``, a body that
is not JSON - is not guessed at: ``read_plain`` answers None, and the lean path
hands the bytes to botocore's own parser (``botocore_answer``), as the client's
endpoint does, so even a malformed answer reads (or fails) as it does through
the client.

``OUTPUT_SHAPES`` is the output shapes of the calls the lean path makes, written
out so that reading an answer needs no botocore (the renewer process renews
without it); a test checks them against botocore's service model.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["OUTPUT_SHAPES", "botocore_answer", "read_plain", "response_metadata"]

# A shape: "string" (any value botocore passes through as it is: strings, numbers,
# booleans), "blob" (base64 text, decoded), ("list", member), ("map", value) (keys
# are strings), or a dict of members (a structure). None: the operation has no output.
Shape = Any
_STRING = "string"
_BLOB = "blob"

_MESSAGE_ATTRIBUTE_VALUE: Shape = {
    "StringValue": _STRING,
    "BinaryValue": _BLOB,
    "StringListValues": ("list", _STRING),
    "BinaryListValues": ("list", _BLOB),
    "DataType": _STRING,
}
_MESSAGE: Shape = {
    "MessageId": _STRING,
    "ReceiptHandle": _STRING,
    "MD5OfBody": _STRING,
    "Body": _STRING,
    "Attributes": ("map", _STRING),
    "MD5OfMessageAttributes": _STRING,
    "MessageAttributes": ("map", _MESSAGE_ATTRIBUTE_VALUE),
}
_BATCH_RESULT: Shape = {
    "Successful": ("list", {"Id": _STRING}),
    "Failed": (
        "list",
        {"Id": _STRING, "SenderFault": _STRING, "Code": _STRING, "Message": _STRING},
    ),
}

#: The output shape of each call the lean path makes (None: no output).
OUTPUT_SHAPES: Mapping[str, Shape] = {
    "ReceiveMessage": {"Messages": ("list", _MESSAGE)},
    "DeleteMessageBatch": _BATCH_RESULT,
    "ChangeMessageVisibilityBatch": _BATCH_RESULT,
    "DeleteMessage": None,
    "ChangeMessageVisibility": None,
}
_MEMBERS = {id(shape): frozenset(shape) for shape in (_MESSAGE_ATTRIBUTE_VALUE, _MESSAGE)}
_DECODER = json.JSONDecoder()


class _NotPlain(Exception):
    """The answer is not one this module reads: botocore's parser reads it."""


def _members(shape: dict[str, Shape]) -> frozenset[str]:
    found = _MEMBERS.get(id(shape))
    if found is None:
        found = _MEMBERS[id(shape)] = frozenset(shape)
    return found


def _read(shape: Shape, value: Any) -> Any:
    """``value`` as botocore's parser makes it of ``shape`` (blobs decoded in place),
    or ``_NotPlain`` where botocore would do something else with it."""
    if shape is _STRING:
        return value
    if value is None:
        raise _NotPlain
    if shape is _BLOB:
        if type(value) is not str:
            raise _NotPlain
        return base64.b64decode(value)
    if type(shape) is dict:
        if type(value) is not dict or not value.keys() <= _members(shape):
            raise _NotPlain
        for name, member in value.items():
            if member is None:  # botocore leaves the member out
                raise _NotPlain
            shape_of = shape[name]
            if shape_of is not _STRING:
                value[name] = _read(shape_of, member)
        return value
    kind, inner = shape
    if kind == "list":
        if type(value) is not list:
            raise _NotPlain
        if inner is not _STRING:
            value[:] = [_read(inner, item) for item in value]
        return value
    if type(value) is not dict:  # a map
        raise _NotPlain
    if inner is not _STRING:
        for key, item in value.items():
            value[key] = _read(inner, item)
    return value


def read_plain(operation: str, body: bytes) -> dict[str, Any] | None:
    """The parsed answer of a successful ``operation`` whose ``body`` keeps to its
    output shape, without its ResponseMetadata; None where botocore's parser must
    read it."""
    shape = OUTPUT_SHAPES[operation]
    if shape is None:
        return {}  # botocore reads no body for an operation without output
    if not body:
        return {}
    try:
        value = _DECODER.decode(body.decode())
        parsed: dict[str, Any] = _read(shape, value)
    except (_NotPlain, ValueError):  # (a str is not a str: botocore says so itself)
        return None
    return parsed


def response_metadata(status: int, headers: dict[str, str], attempts: int) -> dict[str, Any]:
    """The ResponseMetadata botocore adds to a parsed answer (``headers`` with
    lowercase names, as botocore gives them)."""
    meta: dict[str, Any] = {}
    request_id = headers.get("x-amzn-requestid")
    if request_id is not None:
        meta["RequestId"] = request_id
    meta["HTTPStatusCode"] = status
    meta["HTTPHeaders"] = headers
    meta["RetryAttempts"] = attempts
    return meta


class _HTTPAnswer:
    """What botocore's endpoint reads of an HTTP answer."""

    __slots__ = ("content", "headers", "status_code")

    def __init__(self, status_code: int, headers: dict[str, str], content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content


def botocore_answer(
    client: Any, operation_model: Any, status: int, headers: dict[str, str], body: bytes
) -> Any:
    """The parsed answer botocore's endpoint makes of these bytes for ``client``'s
    call: the ``before-parse`` event emitted, the protocol's parser run on the
    operation's output shape, and for an error the modeled error's fields added
    (the steps of botocore's Endpoint._do_get_response). Raises what it raises."""
    from botocore.endpoint import convert_to_response_dict
    from botocore.parsers import create_parser

    answer = _HTTPAnswer(status, headers, body)
    response_dict = convert_to_response_dict(answer, operation_model)
    service_model = operation_model.service_model
    customized: dict[str, Any] = {}
    client.meta.events.emit(
        f"before-parse.{service_model.service_id.hyphenize()}.{operation_model.name}",
        operation_model=operation_model,
        response_dict=response_dict,
        customized_response_dict=customized,
    )
    parser = create_parser(service_model.resolved_protocol)
    parsed = parser.parse(response_dict, operation_model.output_shape)
    parsed.update(customized)
    if status >= 300:
        code = parsed.get("Error", {}).get("Code")
        error_shape = None if code is None else service_model.shape_for_error_code(code)
        if error_shape is not None:
            parsed.update(parser.parse(response_dict, error_shape))
    return parsed
