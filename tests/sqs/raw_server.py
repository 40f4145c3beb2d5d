"""A raw HTTP/1.1 server on loopback for the lean SQS path's tests: each request it
reads (headers, then a body of its Content-Length) is answered with the next
scripted answer - bytes sent as they are, or a function given the connection
(to trickle an answer, cut it short, close it). The same bytes reach botocore
(through urllib3) and the lean path, so their readings can be compared.

``requests`` holds every request as (head lines, body); ``connections`` counts
the connections accepted. An answer scripted with ``keep=False`` closes the
connection after it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

Answer = bytes | Callable[[socket.socket], None]


def http_answer(
    body: bytes,
    status: str = "200 OK",
    headers: tuple[str, ...] = ("Content-Type: application/x-amz-json-1.0",),
    *,
    request_id: str | None = "5f4d3c2b-aaaa-bbbb-cccc-0123456789ab",
) -> bytes:
    """An answer with a Content-Length (and SQS's request id header unless None)."""
    lines = [f"HTTP/1.1 {status}", *headers]
    if request_id is not None:
        lines.append(f"x-amzn-RequestId: {request_id}")
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class RawServer:
    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.answers: deque[tuple[Answer, bool]] = deque()
        self.requests: list[tuple[list[str], bytes]] = []
        self.connections = 0
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._serve, daemon=True).start()

    def answer(self, answer: Answer, *, keep: bool = True) -> None:
        """Answer the next request with ``answer``; close the connection after it
        unless ``keep``."""
        self.answers.append((answer, keep))

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self._open.append(conn)
            threading.Thread(target=self._converse, args=(conn,), daemon=True).start()

    def _converse(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    more = conn.recv(65536)
                    if not more:
                        return
                    data += more
                head, _, data = data.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                length = next(
                    (
                        int(line.split(":", 1)[1])
                        for line in lines
                        if line.lower().startswith("content-length:")
                    ),
                    0,
                )
                while len(data) < length:
                    more = conn.recv(65536)
                    if not more:
                        return
                    data += more
                body, data = data[:length], data[length:]
                with self._lock:
                    self.requests.append((lines, body))
                answer, keep = self.answers.popleft() if self.answers else (_NOTHING, False)
                if callable(answer):
                    answer(conn)
                else:
                    conn.sendall(answer)
                if not keep:
                    return

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        with self._lock:
            for conn in self._open:
                with contextlib.suppress(OSError):
                    conn.close()

    def __enter__(self) -> RawServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_NOTHING = http_answer(
    b'{"__type":"com.amazonaws.sqs#InternalError","message":"nothing scripted"}',
    "500 Internal Server Error",
)


def header(lines: list[str], name: str) -> str | None:
    """The value of header ``name`` in a request's head lines (None: absent)."""
    for line in lines[1:]:
        key, _, value = line.partition(":")
        if key.strip().lower() == name.lower():
            return value.strip()
    return None
