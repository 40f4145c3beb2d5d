"""The candidates measured for the lean SQS call path (benchmarks/bench_sqs_path.py):
the path as shipped and variants with one part swapped, where installed
(botocore's SigV4Auth or awscrt's signer for our own, http.client for our own
keep-alive client, orjson for json)."""

from __future__ import annotations

import http.client
import importlib.util
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest

from leasekeeper.backends.sqs.lean import CLIENT_METHODS, JSON_CONTENT_TYPE, LeanPath

Call = Callable[[str, dict[str, Any]], Any]


class BotocoreSigned(LeanPath):
    """The lean path signing with botocore's generic SigV4 signer (``signer``)."""

    signer: Any = SigV4Auth

    def _headers(
        self, operation: str, body: bytes, invocation: str, attempt: int
    ) -> dict[str, str]:
        headers = {
            "Content-Type": JSON_CONTENT_TYPE,
            "X-Amz-Target": "AmazonSQS." + operation,
            "x-amzn-query-mode": "true",
        }
        request = AWSRequest(method="POST", url=self.endpoint, data=body, headers=headers)
        credentials = self._credentials.get_frozen_credentials()
        self.signer(credentials, "sqs", self._region).add_auth(request)
        return dict(request.headers.items())  # (no User-Agent: the signer's cost alone)


class HttpClientPath(LeanPath):
    """The lean path over the stdlib's http.client, one connection per thread."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        parts = urlsplit(self.endpoint)
        self._host, self._port = parts.hostname or "", parts.port or 80
        self._local = threading.local()

    def _send(self, operation: str, body: bytes, invocation: str, attempt: int) -> Any:
        from leasekeeper.backends.sqs.lean import _Answer

        headers = self._headers(operation, body, invocation, attempt)
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._local.connection = http.client.HTTPConnection(
                self._host, self._port, timeout=60
            )
        connection.request("POST", "/", body=body, headers=headers)
        response = connection.getresponse()
        data = response.read()
        found = {name.lower(): value for name, value in response.getheaders()}
        return _Answer(response.status, found), data


def candidates(client: Any) -> dict[str, Call]:
    """Name -> call(operation, params): the boto3 client, the lean path as shipped,
    and each variant whose package is installed."""
    out: dict[str, Call] = {
        "boto3 client": lambda op, params: getattr(client, CLIENT_METHODS[op])(**params),
        "lean (own SigV4 signer and keep-alive client, json)": LeanPath.of(client).call,
        "lean, botocore's SigV4Auth": BotocoreSigned.of(client).call,
        "lean over http.client": HttpClientPath.of(client).call,
    }
    if importlib.util.find_spec("awscrt") is not None:
        from botocore.crt.auth import CrtSigV4Auth

        class CrtSigned(BotocoreSigned):
            signer = CrtSigV4Auth

        out["lean, awscrt's SigV4 signer"] = CrtSigned.of(client).call
    if importlib.util.find_spec("orjson") is not None:
        import orjson

        class OrjsonCoded(LeanPath):
            encode = staticmethod(orjson.dumps)  # (answers: the stdlib's json, as shipped)

        out["lean, orjson codec"] = OrjsonCoded.of(client).call
    return out
