"""Helpers for tests that answer boto3 calls with botocore's Stubber (no server).

The error responses are shaped as the real service sends them: SQS speaks the JSON
protocol in query-compatible mode, so botocore puts the legacy code in
``Error.Code`` (``AWS.SimpleQueueService.NonExistentQueue``) and the short one in
``Error.QueryErrorCode`` (``QueueDoesNotExist``); its messages may quote the
receipt handle.
"""

from __future__ import annotations

import base64
import os
from typing import Any

import boto3
from botocore.stub import Stubber

from leasekeeper.backends.base import Handle
from leasekeeper.backends.sqs import SQSBackend

REGION = "us-east-1"
QUEUE_URL = "https://sqs.us-east-1.amazonaws.com/123456789012/jobs"
FIFO_URL = "https://sqs.us-east-1.amazonaws.com/123456789012/jobs.fifo"


def receipt() -> str:
    """A receipt handle shaped like a real one (long base64 starting "AQEB")."""
    return "AQEB" + base64.b64encode(os.urandom(240)).decode()


def stubbed(url: str = QUEUE_URL, clock: Any = None) -> tuple[SQSBackend, Stubber, Any]:
    client = boto3.client(
        "sqs", region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing"
    )
    stubber = Stubber(client)
    stubber.activate()
    return SQSBackend(client, url, clock=clock), stubber, client


def handles(count: int) -> list[Handle]:
    return [Handle(f"id-{index}", receipt()) for index in range(count)]


def sqs_message(
    message_id: str,
    receipt_handle: str,
    body: str = "job",
    *,
    receive_count: int = 1,
    first_receive_ms: int | None = None,
    sent_ms: int | None = None,
) -> dict[str, Any]:
    attributes = {"ApproximateReceiveCount": str(receive_count), "SenderId": "AIDAEXAMPLE"}
    if first_receive_ms is not None:
        attributes["ApproximateFirstReceiveTimestamp"] = str(first_receive_ms)
    if sent_ms is not None:
        attributes["SentTimestamp"] = str(sent_ms)
    return {
        "MessageId": message_id,
        "ReceiptHandle": receipt_handle,
        "MD5OfBody": "0" * 32,
        "Body": body,
        "Attributes": attributes,
    }


def add_error(
    stubber: Stubber,
    method: str,
    *,
    code: str,
    query_code: str | None,
    message: str,
    status: int,
) -> None:
    """A whole-call error shaped like the real service's (see the module docstring)."""
    meta: dict[str, str] = {"Type": "Sender" if status < 500 else "Receiver"}
    if query_code:
        meta["QueryErrorCode"] = query_code
    stubber.add_client_error(
        method,
        service_error_code=code,
        service_message=message,
        http_status_code=status,
        service_error_meta=meta,
    )


def change_entries(batch: list[Handle], seconds: int) -> list[dict[str, Any]]:
    return [
        {"Id": str(index), "ReceiptHandle": handle.receipt, "VisibilityTimeout": seconds}
        for index, handle in enumerate(batch)
    ]


def delete_entries(batch: list[Handle]) -> list[dict[str, Any]]:
    return [
        {"Id": str(index), "ReceiptHandle": handle.receipt} for index, handle in enumerate(batch)
    ]


_ACTIONS = {
    "receive_message": "ReceiveMessage",
    "delete_message_batch": "DeleteMessageBatch",
    "change_message_visibility_batch": "ChangeMessageVisibilityBatch",
}


class Answers:
    """Recorded answers for an SQSBackend on either call path: ``path="boto3"``
    answers inside the client with botocore's Stubber; ``path="lean"`` answers
    the lean path's requests from a loopback server (tests/sqs/scripted.py) with
    the same errors as SQS's JSON protocol carries them. ``error`` and
    ``response`` queue an answer for a client method; ``done()`` checks every
    answer was used and each request carried the parameters it expected."""

    def __init__(self, path: str, url: str = QUEUE_URL, clock: Any = None) -> None:
        from tests.sqs.scripted import ScriptedSQS

        self.path = path
        self.script: ScriptedSQS | None = None
        self._expected: list[tuple[str, dict[str, Any] | None]] = []
        if path == "boto3":
            self.backend, self.stubber, self.client = stubbed(url, clock)
            assert self.backend.lean is None or not self.backend.lean.usable()
            return
        self.script = ScriptedSQS()
        self.client = boto3.client(
            "sqs",
            region_name=REGION,
            endpoint_url=self.script.url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        self.backend = SQSBackend(self.client, url, clock=clock)
        assert self.backend.lean is not None and self.backend.lean.usable()

    def error(
        self, method: str, *, code: str, query_code: str | None, message: str, status: int
    ) -> None:
        if self.script is None:
            answer = {"code": code, "query_code": query_code, "message": message}
            add_error(self.stubber, method, status=status, **answer)
            return
        self.script.error(
            _ACTIONS[method], code=code, query_code=query_code, message=message, status=status
        )
        self._expected.append((_ACTIONS[method], None))

    def response(
        self, method: str, response: dict[str, Any], expected: dict[str, Any] | None = None
    ) -> None:
        if self.script is None:
            self.stubber.add_response(method, response, expected)
            return
        self.script.answer(_ACTIONS[method], response)
        self._expected.append((_ACTIONS[method], expected))

    def done(self) -> None:
        if self.script is None:
            self.stubber.assert_no_pending_responses()
            return
        assert self.script.pending() == 0
        sent = self.script.requests
        assert [action for action, _ in sent] == [action for action, _ in self._expected]
        for (_, payload), (_, expected) in zip(sent, self._expected, strict=True):
            assert expected is None or payload == expected

    def close(self) -> None:
        if self.script is not None:
            self.script.close()
