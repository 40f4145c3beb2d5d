"""A minimal HTTP/1.1 client for the lean SQS path: POSTs over pooled keep-alive
connections to one endpoint.

urllib3 and http.client cost the lean path about as much CPU as everything else
in a call: http.client parses every answer's headers with the ``email``
package's feed parser, urllib3 wraps each exchange in several objects. An SQS
answer needs none of that: a status line, a few headers, a body of known length.
So ``KeepAlivePool.post`` writes the request in one ``sendall`` and reads the
answer with a buffered reader, keeping the headers as a lowercase-named dict.

What it honours of the client: its connect and read timeouts (the read one per
socket operation, as urllib3), its pool size (idle connections kept), TLS with
the client's verification setting. A connection is reused while the server keeps
it open (``Connection: close``, an HTTP/1.0 answer or a body read to the end of
the stream retire it). A connection that went idle is checked before reuse
(readable means the server closed it, as urllib3 checks). A request is sent
again on a fresh connection only when sending it failed on a reused one: the
server cannot have answered a request it did not get whole, whereas one that
got no answer may have been carried out (a ReceiveMessage would hide its
messages), which the caller's retry policy decides, as for botocore.

Failures raise the ``OSError`` subclasses of the standard library (``socket.timeout``,
``ConnectionError``, ``ssl.SSLError``) wrapped in ``ExchangeError`` which says
which phase failed; the SQS path maps them to botocore's exceptions.
"""

from __future__ import annotations

import select
import socket
import ssl
from collections import deque
from collections.abc import Mapping
from typing import BinaryIO

__all__ = ["ExchangeError", "KeepAlivePool"]

_MAX_LINE = 65536
_MAX_HEADERS = 100


class ExchangeError(Exception):
    """An exchange that failed: ``phase`` is ``connect``, ``send`` or ``read``, and
    ``cause`` the error of the socket (or a ``ConnectionError`` for a malformed or
    cut-short answer)."""

    def __init__(self, phase: str, cause: BaseException) -> None:
        super().__init__(f"{phase}: {cause!r}")
        self.phase = phase
        self.cause = cause


class _Connection:
    __slots__ = ("reader", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader: BinaryIO = sock.makefile("rb")

    def dropped(self) -> bool:
        """Did the server close this idle connection (or send something unasked)?"""
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def close(self) -> None:
        try:
            self.reader.close()
        finally:
            self.sock.close()


class KeepAlivePool:
    """POSTs to ``host``:``port`` (TLS when ``tls`` is an SSL context); thread-safe.

    ``post(path, headers, body)`` answers ``(status, headers, body)`` with header
    names in lowercase, or raises ``ExchangeError``.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        host_header: str,
        connect_timeout: float | None,
        read_timeout: float | None,
        maxsize: int = 10,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._address = (host, port)
        self._server_hostname = host
        self._host_line = f"Host: {host_header}\r\n"
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._tls = tls
        self._maxsize = max(1, maxsize)
        # LIFO of idle connections: deque's append and pop are atomic, no lock needed
        self._idle: deque[_Connection] = deque()

    def _connect(self) -> _Connection:
        try:
            sock = socket.create_connection(self._address, timeout=self._connect_timeout)
        except OSError as exc:
            raise ExchangeError("connect", exc) from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self._server_hostname)
            sock.settimeout(self._read_timeout)
        except OSError as exc:
            sock.close()
            raise ExchangeError("connect", exc) from None
        return _Connection(sock)

    def _checkout(self) -> tuple[_Connection, bool]:
        """A connection and whether it was reused."""
        while True:
            try:
                connection = self._idle.pop()
            except IndexError:
                return self._connect(), False
            if not connection.dropped():
                return connection, True
            connection.close()

    def _checkin(self, connection: _Connection) -> None:
        if len(self._idle) < self._maxsize:
            self._idle.append(connection)
        else:
            connection.close()

    def post(
        self, path: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        head = [f"POST {path} HTTP/1.1\r\n", self._host_line]
        head.extend(f"{name}: {value}\r\n" for name, value in headers.items())
        head.append(f"Content-Length: {len(body)}\r\n\r\n")
        request = "".join(head).encode("latin-1") + body
        connection, reused = self._checkout()
        try:
            connection.sock.sendall(request)
        except OSError as exc:
            connection.close()
            if not reused:
                raise ExchangeError("send", exc) from None
            # a reused connection the server had closed: it got no whole request
            connection = self._connect()
            try:
                connection.sock.sendall(request)
            except OSError as again:
                connection.close()
                raise ExchangeError("send", again) from None
        try:
            status, found, data, keep = self._read(connection.reader)
        except (OSError, ValueError) as exc:
            connection.close()
            raise ExchangeError("read", exc) from None
        if keep:
            self._checkin(connection)
        else:
            connection.close()
        return status, found, data

    @staticmethod
    def _read(reader: BinaryIO) -> tuple[int, dict[str, str], bytes, bool]:
        line = reader.readline(_MAX_LINE)
        if not line:
            raise ConnectionError("the server closed the connection without an answer")
        version, _, rest = line.partition(b" ")
        code = rest[:3]
        if not version.startswith(b"HTTP/") or not code.isdigit():
            raise ConnectionError("not an HTTP answer")
        status = int(code)
        headers: dict[str, str] = {}
        for _ in range(_MAX_HEADERS):
            line = reader.readline(_MAX_LINE)
            if line in (b"\r\n", b"\n"):
                break
            if not line:
                raise ConnectionError("the answer ended within its headers")
            name, _, value = line.partition(b":")
            key = name.decode("latin-1").strip().lower()
            text = value.decode("latin-1").strip()
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        else:
            raise ConnectionError("too many headers")
        connection = headers.get("connection", "").lower()
        keep = "close" not in connection and (version != b"HTTP/1.0" or "keep-alive" in connection)
        if status < 200 or status in (204, 304):  # no body (1xx are not expected here)
            return status, headers, b"", keep
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return status, headers, _read_chunked(reader), keep
        length = headers.get("content-length")
        if length is None:  # the body runs to the end of the stream
            return status, headers, reader.read(), False
        size = int(length)
        data = reader.read(size)
        if len(data) != size:
            raise ConnectionError("the answer ended within its body")
        return status, headers, data, keep

    def close(self) -> None:
        while True:
            try:
                self._idle.pop().close()
            except IndexError:
                return


def _read_chunked(reader: BinaryIO) -> bytes:
    parts: list[bytes] = []
    while True:
        line = reader.readline(_MAX_LINE)
        if not line:
            raise ConnectionError("the answer ended within a chunk")
        size = int(line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while reader.readline(_MAX_LINE) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(parts)
        chunk = reader.read(size + 2)
        if len(chunk) != size + 2:
            raise ConnectionError("the answer ended within a chunk")
        parts.append(chunk[:size])
