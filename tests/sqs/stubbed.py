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
