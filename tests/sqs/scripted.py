"""A loopback HTTP server that answers SQS's JSON protocol as the real service does:
the lean call path's equivalent of botocore's Stubber (which answers inside the
client, where the lean path never goes).

``ScriptedSQS(upstream=None)`` listens on 127.0.0.1. An answer queued for an
action (``error``, ``answer``, ``reset``) is sent to the next request of that
action, shaped as SQS sends it: an error is ``{"__type":
"com.amazonaws.sqs#<QueryErrorCode>", "message": ...}`` with the legacy code in
the ``x-amzn-query-error`` header, so botocore (and the lean path) read
``Error.Code`` = the legacy code and ``Error.QueryErrorCode`` = the short one. A
request with nothing queued is forwarded to ``upstream`` (moto), or, without one,
answered 500 "nothing queued" (the test forgot an answer). ``requests`` holds
every (action, payload) it was sent.
"""

from __future__ import annotations

import http.client
import json
import threading
import uuid
from collections import defaultdict, deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

JSON = "application/x-amz-json-1.0"


class ScriptedSQS:
    def __init__(self, upstream: str | None = None) -> None:
        self.upstream = upstream
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self._queued: dict[str, deque[tuple[int, dict[str, str], bytes] | None]] = defaultdict(
            deque
        )
        self._lock = threading.Lock()
        script = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                script._handle(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ scripting

    def error(
        self, action: str, *, code: str, query_code: str | None, message: str, status: int
    ) -> None:
        """The next ``action`` fails as SQS fails: ``code`` the legacy code botocore
        puts in ``Error.Code``, ``query_code`` its ``QueryErrorCode`` (None: a
        ``__type`` alone, as for InvalidParameterValue)."""
        body = {"__type": f"com.amazonaws.sqs#{query_code or code}", "message": message}
        headers = {"x-amzn-RequestId": str(uuid.uuid4())}
        if query_code:
            headers["x-amzn-query-error"] = f"{code};{'Sender' if status < 500 else 'Receiver'}"
        self._queue(action, (status, headers, json.dumps(body).encode()))

    def answer(self, action: str, body: dict[str, Any], status: int = 200) -> None:
        """The next ``action`` is answered ``body``."""
        headers = {"x-amzn-RequestId": str(uuid.uuid4())}
        self._queue(action, (status, headers, json.dumps(body).encode()))

    def reset(self, action: str) -> None:
        """The next ``action``'s connection is closed without an answer."""
        self._queue(action, None)

    def pending(self) -> int:
        with self._lock:
            return sum(len(queued) for queued in self._queued.values())

    def _queue(self, action: str, answer: tuple[int, dict[str, str], bytes] | None) -> None:
        with self._lock:
            self._queued[action].append(answer)

    # ------------------------------------------------------------------ serving

    def _handle(self, request: BaseHTTPRequestHandler) -> None:
        length = int(request.headers.get("Content-Length") or 0)
        body = request.rfile.read(length)
        action = str(request.headers.get("X-Amz-Target", "")).rsplit(".", 1)[-1]
        payload = json.loads(body) if body else {}
        with self._lock:
            self.requests.append((action, payload))
            queued = self._queued.get(action)
            scripted = bool(queued)
            answer = queued.popleft() if queued else None
        if scripted and answer is None:
            request.close_connection = True
            request.connection.shutdown(2)  # SHUT_RDWR: no answer at all
            return
        if answer is None:
            answer = self._forward(request, body) if self.upstream else self._unscripted(action)
        status, headers, data = answer
        request.send_response(status)
        request.send_header("Content-Type", JSON)
        for name, value in headers.items():
            request.send_header(name, value)
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)

    @staticmethod
    def _unscripted(action: str) -> tuple[int, dict[str, str], bytes]:
        body = {"__type": "com.amazonaws.sqs#InternalError", "message": f"nothing queued: {action}"}
        return 500, {}, json.dumps(body).encode()

    def _forward(
        self, request: BaseHTTPRequestHandler, body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        parts = urlsplit(str(self.upstream))
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
        try:
            headers = {
                k: v for k, v in request.headers.items() if k.lower() not in ("content-length",)
            }
            connection.request("POST", request.path, body=body, headers=headers)
            response = connection.getresponse()
            kept = {
                k: v
                for k, v in response.getheaders()
                if k.lower() in ("x-amzn-requestid", "x-amzn-query-error")
            }
            return response.status, kept, response.read()
        finally:
            connection.close()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> ScriptedSQS:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
