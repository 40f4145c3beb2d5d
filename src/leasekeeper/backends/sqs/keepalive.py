"""A minimal HTTP/1.1 client for the lean SQS path: POSTs over pooled keep-alive
connections to one endpoint.

urllib3 and http.client cost the lean path about as much CPU as everything else
in a call: http.client parses every answer's headers with the ``email``
package's feed parser, urllib3 wraps each exchange in several objects. An SQS
answer needs none of that: a status line, a few headers, a body of known length.
So ``KeepAlivePool.post`` writes the request in one ``sendall`` and reads the
answer with ``recv`` into one buffer, keeping the headers as a lowercase-named dict.

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

import ipaddress
import select
import socket
import ssl
from collections import deque
from collections.abc import Mapping

__all__ = ["ExchangeError", "KeepAlivePool"]

_READ_SIZE = 65536
_MAX_HEAD = 65536


class ExchangeError(Exception):
    """An exchange that failed: ``phase`` is ``connect``, ``send`` or ``read``, and
    ``cause`` the error of the socket (or a ``ConnectionError`` for a malformed or
    cut-short answer)."""

    def __init__(self, phase: str, cause: BaseException) -> None:
        super().__init__(f"{phase}: {cause!r}")
        self.phase = phase
        self.cause = cause


def _address_family(host: str) -> socket.AddressFamily | None:
    """The family of ``host`` if it is an IP address, else None (a name to resolve)."""
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return None


class _Connection:
    __slots__ = ("sock",)

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def dropped(self) -> bool:
        """Did the server close this idle connection (or send something unasked)?"""
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def close(self) -> None:
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
        self._literal = _address_family(host)
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
            if self._literal is None:
                sock = socket.create_connection(self._address, timeout=self._connect_timeout)
            else:  # an address already: no resolver call (moto answers one call a connection)
                sock = socket.socket(self._literal, socket.SOCK_STREAM)
                try:
                    sock.settimeout(self._connect_timeout)
                    sock.connect(self._address)
                except BaseException:
                    sock.close()
                    raise
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
            status, found, data, keep = self._read(connection.sock)
        except (OSError, ValueError) as exc:
            connection.close()
            raise ExchangeError("read", exc) from None
        if keep:
            self._checkin(connection)
        else:
            connection.close()
        return status, found, data

    @staticmethod
    def _read(sock: socket.socket) -> tuple[int, dict[str, str], bytes, bool]:
        """One answer off ``sock``: status, headers, body, and whether the
        connection may carry another request. Reads with ``recv`` into one buffer
        (an answer of SQS's size usually arrives in one or two reads)."""
        data = sock.recv(_READ_SIZE)
        if not data:
            raise ConnectionError("the server closed the connection without an answer")
        end = data.find(b"\r\n\r\n")
        while end < 0:
            if len(data) > _MAX_HEAD:
                raise ConnectionError("the answer's headers are too long")
            more = sock.recv(_READ_SIZE)
            if not more:
                raise ConnectionError("the answer ended within its headers")
            data += more
            end = data.find(b"\r\n\r\n", max(0, len(data) - len(more) - 3))
        lines = data[:end].decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/") or not code.isdigit():
            raise ConnectionError("not an HTTP answer")
        status = int(code)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            key = name.strip().lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        connection = headers.get("connection", "").lower()
        keep = "close" not in connection and (version != "HTTP/1.0" or "keep-alive" in connection)
        body = data[end + 4 :]
        if status < 200 or status in (204, 304):  # no body (1xx are not expected here)
            return status, headers, b"", keep and not body
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return status, headers, _read_chunked(sock, body), False
        length = headers.get("content-length")
        if length is None:  # the body runs to the end of the stream
            parts = [body]
            while True:
                more = sock.recv(_READ_SIZE)
                if not more:
                    return status, headers, b"".join(parts), False
                parts.append(more)
        size = int(length)
        if len(body) < size:
            parts = [body]
            got = len(body)
            while got < size:
                more = sock.recv(max(_READ_SIZE, size - got))
                if not more:
                    raise ConnectionError("the answer ended within its body")
                parts.append(more)
                got += len(more)
            body = b"".join(parts)
        # anything after the body was not asked for: the connection is not reused
        return status, headers, body[:size], keep and len(body) == size

    def close(self) -> None:
        while True:
            try:
                self._idle.pop().close()
            except IndexError:
                return


def _read_chunked(sock: socket.socket, data: bytes) -> bytes:
    """A chunked body (``data`` what arrived of it with the headers), read to its end;
    the connection is not reused after one (SQS does not send them)."""
    parts: list[bytes] = []
    while True:
        while b"\r\n" not in data:
            more = sock.recv(_READ_SIZE)
            if not more:
                raise ConnectionError("the answer ended within a chunk")
            data += more
        line, _, data = data.partition(b"\r\n")
        size = int(line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            return b"".join(parts)  # trailers, if any, go with the connection
        while len(data) < size + 2:
            more = sock.recv(_READ_SIZE)
            if not more:
                raise ConnectionError("the answer ended within a chunk")
            data += more
        parts.append(data[:size])
        data = data[size + 2 :]
