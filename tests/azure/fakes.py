"""A fake azure-core transport: canned HTTP answers, run through the real SDK pipeline.

The SDK turns a canned error response into exactly the exception a real service
answer would give (``HttpResponseError``/``ResourceNotFoundError``/
``ClientAuthenticationError`` with ``error_code``, ``status_code`` and
``additional_info``), so the backend's error mapping is tested on real exception
objects for the codes Azurite never produces.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from email.utils import formatdate
from typing import Any

import requests
from azure.core.pipeline.transport import RequestsTransport, RequestsTransportResponse
from azure.storage.queue import QueueClient
from requests.structures import CaseInsensitiveDict

from tests.azure.settings import ACCOUNT, KEY

Answer = requests.Response | BaseException


def error_response(
    status: int, code: str, extra: dict[str, str] | None = None, message: str = "Failed."
) -> requests.Response:
    """An Azure Storage error answer: x-ms-error-code header plus the XML body."""
    details = "".join(f"<{k}>{v}</{k}>" for k, v in (extra or {}).items())
    body = (
        '<?xml version="1.0" encoding="utf-8"?>'
        f"<Error><Code>{code}</Code><Message>{message}\nRequestId:00000000-0000</Message>"
        f"{details}</Error>"
    )
    response = requests.Response()
    response.status_code = status
    response.reason = "Error"
    response._content = body.encode()
    response.headers = CaseInsensitiveDict(
        {
            "Content-Type": "application/xml",
            "x-ms-error-code": code,
            "x-ms-request-id": "00000000-0000",
            "Content-Length": str(len(body)),
        }
    )
    return response


def updated_response(receipt: str, visible_in: float = 30.0) -> requests.Response:
    """A successful Update Message answer (204 with the new pop receipt)."""
    import time

    response = requests.Response()
    response.status_code = 204
    response.reason = "No Content"
    response._content = b""
    response.headers = CaseInsensitiveDict(
        {
            "x-ms-popreceipt": receipt,
            "x-ms-time-next-visible": formatdate(time.time() + visible_in, usegmt=True),
            "x-ms-request-id": "00000000-0000",
            "Content-Length": "0",
        }
    )
    return response


def no_content() -> requests.Response:
    response = requests.Response()
    response.status_code = 204
    response.reason = "No Content"
    response._content = b""
    response.headers = CaseInsensitiveDict({"Content-Length": "0"})
    return response


class FakeTransport(RequestsTransport):
    """Answers every request with ``plan(request)``: a response, or an exception to raise."""

    def __init__(self, plan: Callable[[Any], Answer]) -> None:
        super().__init__()
        self.plan = plan
        self.sent: list[tuple[str, str]] = []  # (method, url)
        self._lock = threading.Lock()

    def send(self, request: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        with self._lock:
            self.sent.append((request.method, request.url))
        answer = self.plan(request)
        if isinstance(answer, BaseException):
            raise answer
        return RequestsTransportResponse(request, answer)


def fake_client(transport: FakeTransport) -> QueueClient:
    return QueueClient(
        account_url=f"http://127.0.0.1:9/{ACCOUNT}",
        queue_name="fake-queue",
        credential={"account_name": ACCOUNT, "account_key": KEY},
        transport=transport,
        retry_total=0,
    )
