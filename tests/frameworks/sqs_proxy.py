"""A counting proxy in front of moto's server: every SQS call the workers make, with
its action, its request and its answer, so a test can count calls per task, see
which receipts were renewed (and to what timeout), and when each was deleted.

It speaks both of SQS's protocols: JSON (``X-Amz-Target: AmazonSQS.<Action>``, what
boto3 and kombu send) and the older query form (``Action=<Action>``).

It forwards the calls that rebuild moto's message list (deletes, sends) one at a
time: moto rebuilds the list without a lock, so of two deletes that overlap one is
lost and its message comes back (Dramatiq's worker threads ack concurrently).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

# moto rebuilds or appends to a queue's message list for these without a lock.
_SERIAL = {"DeleteMessage", "DeleteMessageBatch", "SendMessage", "SendMessageBatch"}
# Tries at moto for one call before the proxy answers 502 (0.05 s, then twice as
# long before each next).
_ATTEMPTS = 5
# Headers that belong to one hop, never forwarded.
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "proxy-connection"}


@dataclass
class Call:
    at: float  # time.monotonic() when the answer came back
    action: str
    request: dict[str, Any]
    response: dict[str, Any] = field(default_factory=dict)
    status: int = 0
    took: float = 0.0  # seconds upstream

    @property
    def queue_url(self) -> str:
        return str(self.request.get("QueueUrl", ""))

    def receipts(self) -> list[str]:
        """The receipts this call acts on (deletes, visibility changes)."""
        if "ReceiptHandle" in self.request:
            return [str(self.request["ReceiptHandle"])]
        return [str(entry.get("ReceiptHandle")) for entry in self.request.get("Entries", [])]

    def received(self) -> list[dict[str, Any]]:
        """The messages a ReceiveMessage answered with."""
        if self.action != "ReceiveMessage":
            return []
        return list(self.response.get("Messages", []) or [])


def _parse_query(body: bytes) -> tuple[str, dict[str, Any]]:
    fields = {key: values[-1] for key, values in parse_qs(body.decode()).items()}
    action = fields.pop("Action", "")
    request: dict[str, Any] = {"QueueUrl": fields.get("QueueUrl", "")}
    entries: dict[str, dict[str, str]] = {}
    for key, value in fields.items():
        if key == "ReceiptHandle":
            request["ReceiptHandle"] = value
        parts = key.split(".")
        if len(parts) == 3 and parts[0].endswith("Entry"):
            entries.setdefault(parts[1], {})[parts[2]] = value
    if entries:
        request["Entries"] = [entries[index] for index in sorted(entries, key=int)]
    return action, request


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A worker SIGKILLed mid-request leaves a broken pipe: not the proxy's news.
        pass


class CountingProxy:
    """``CountingProxy(upstream)`` listens on 127.0.0.1 (``endpoint``) and forwards to
    ``upstream`` (``http://host:port``); ``calls`` is every call, in order."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.calls: list[Call] = []
        self._lock = threading.Lock()  # guards calls
        self._serial = threading.Lock()  # held while a _SERIAL call is forwarded
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                # The headers and the body go out in two writes: without NODELAY,
                # Nagle's algorithm and the client's delayed ACK hold the second one
                # back ~40 ms per call.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                proxy.forward(self)

            def do_GET(self) -> None:
                proxy.forward(self)

        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._local = threading.local()
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection(*self._upstream, timeout=60)
        return conn

    def forward(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length", "0") or 0)
        body = handler.rfile.read(length) if length else b""
        target = handler.headers.get("X-Amz-Target", "")
        if target:
            action = target.rpartition(".")[2]
            try:
                request = json.loads(body or b"{}")
            except ValueError:
                request = {}
        else:
            action, request = _parse_query(body)
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in _HOP}
        sent = time.monotonic()
        if action in _SERIAL:
            with self._serial:
                exchanged = self._exchange(handler, body, headers)
        else:
            exchanged = self._exchange(handler, body, headers)
        if exchanged is None:
            handler.send_error(502)
            return
        answer, payload = exchanged
        answered = time.monotonic()
        call = Call(answered, action, request, status=answer.status, took=answered - sent)
        if target and payload:
            with contextlib.suppress(ValueError):
                call.response = json.loads(payload)
        with self._lock:
            self.calls.append(call)
        handler.send_response(answer.status)
        for key, value in answer.getheaders():
            if key.lower() not in _HOP and key.lower() != "content-length":
                handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

    def _exchange(
        self, handler: BaseHTTPRequestHandler, body: bytes, headers: dict[str, str]
    ) -> tuple[http.client.HTTPResponse, bytes] | None:
        # moto, loaded, now and then drops a connection without an answer. The proxy
        # counts calls; it must not add faults of its own: a 502 for a receive makes
        # kombu 5.7's SQS channel crash the Celery worker ("Unrecoverable error:
        # AttributeError: 'list' object has no attribute 'get'": its receive takes
        # the empty list it makes of a 5xx for a parsed answer). So it tries again,
        # for about a second, before it gives up.
        for attempt in range(_ATTEMPTS):
            conn = self._connection()
            try:
                conn.request(handler.command, handler.path, body=body, headers=headers)
                answer = conn.getresponse()
                return answer, answer.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt + 1 < _ATTEMPTS:
                    time.sleep(0.05 * 2**attempt)
        return None

    def snapshot(self) -> list[Call]:
        with self._lock:
            return list(self.calls)

    def count(self, queue_url: str) -> Counter[str]:
        """Calls per action on ``queue_url``."""
        return Counter(call.action for call in self.snapshot() if call.queue_url == queue_url)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
