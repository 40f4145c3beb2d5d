"""The candidates measured for the lean SQS call path (benchmarks/bench_sqs_path.py):
the path as shipped and variants with one part swapped, where installed."""

from __future__ import annotations

import http.client
import importlib.util
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from leasekeeper.backends.sqs_http import CLIENT_METHODS, LeanPath

Call = Callable[[str, dict[str, Any]], Any]


class HttpClientPath(LeanPath):
    """The lean path over the stdlib's http.client, one connection per thread."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        parts = urlsplit(self.endpoint)
        self._host, self._port = parts.hostname or "", parts.port or 80
        self._local = threading.local()

    def _send(self, operation: str, body: bytes) -> Any:
        from leasekeeper.backends.sqs_http import _Answer

        headers = self._signed_headers(operation, body)
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
        "lean (botocore SigV4Auth, urllib3, json)": LeanPath(client).call,
        "lean over http.client": HttpClientPath(client).call,
    }
    if importlib.util.find_spec("awscrt") is not None:
        from botocore.crt.auth import CrtSigV4Auth

        class CrtSigned(LeanPath):
            signer = CrtSigV4Auth

        out["lean, awscrt's SigV4 signer"] = CrtSigned(client).call
    if importlib.util.find_spec("orjson") is not None:
        import orjson

        class OrjsonCoded(LeanPath):
            encode = staticmethod(orjson.dumps)
            decode = staticmethod(orjson.loads)

        out["lean, orjson codec"] = OrjsonCoded(client).call
    return out
