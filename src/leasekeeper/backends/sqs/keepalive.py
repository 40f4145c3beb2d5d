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

What it guards against: the idle check is a ``poll`` (``select.select`` refuses a
socket numbered past 1023, which a busy worker holds); interim answers (``100
Continue`` and the other 1xx) are skipped; an answer that announces more than
``MAX_BODY`` is refused before a byte of it is read, and every ``recv`` asks for at
most ``_READ_SIZE`` (a ``Content-Length`` never sizes a buffer); and one exchange -
connect, send and answer - ends within the connect and read timeouts added up,
however slowly an answer trickles in (the read timeout alone is per socket
operation, as urllib3's).

Failures raise the ``OSError`` subclasses of the standard library (``socket.timeout``,
``ConnectionError``, ``ssl.SSLError``) wrapped in ``ExchangeError`` which says
which phase failed; the SQS path maps them to botocore's exceptions.
"""

from __future__ import annotations

import ipaddress
import select
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping

__all__ = ["MAX_BODY", "ExchangeError", "KeepAlivePool"]

_READ_SIZE = 65536
_MAX_HEAD = 65536
#: The longest body an answer may announce: ten SQS messages of 1 MiB, their
#: attributes and JSON's escapes fit many times over.
MAX_BODY = 64 * 1024 * 1024
_POLLIN = getattr(select, "POLLIN", 1)


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


def _readable(sock: socket.socket) -> bool:
    """Is there something to read on ``sock`` now (or has its peer closed it)?
    ``poll`` works at any descriptor number; ``select`` only below 1024."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, _POLLIN)
        return bool(poller.poll(0))
    readable, _, _ = select.select([sock], [], [], 0)  # pragma: no cover - no poll()
    return bool(readable)


class _Connection:
    __slots__ = ("sock",)

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def dropped(self) -> bool:
        """Did the server close this idle connection (or send something unasked)?"""
        try:
            return _readable(self.sock)
        except (OSError, ValueError):
            return True

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
        tls: ssl.SSLContext | Callable[[], ssl.SSLContext] | None = None,
    ) -> None:
        """``tls``: an SSL context, or a function that makes one, called at the first
        connection (loading a CA bundle can fail: each exchange then fails as its
        connect would, ``ExchangeError("connect", ...)``, and tries again)."""
        self._address = (host, port)
        self._literal = _address_family(host)
        self._server_hostname = host
        self._host_line = f"Host: {host_header}\r\n"
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        # One exchange ends within both timeouts added up (None: no limit, as theirs).
        self._budget = (
            None
            if connect_timeout is None or read_timeout is None
            else connect_timeout + read_timeout
        )
        self._tls: ssl.SSLContext | None = tls if isinstance(tls, ssl.SSLContext) else None
        self._make_tls = tls if callable(tls) and self._tls is None else None
        self._tls_lock = threading.Lock()
        self._maxsize = max(1, maxsize)
        # LIFO of idle connections: deque's append and pop are atomic, no lock needed
        self._idle: deque[_Connection] = deque()

    def _tls_context(self) -> ssl.SSLContext | None:
        if self._tls is None and self._make_tls is not None:
            with self._tls_lock:
                if self._tls is None:
                    self._tls = self._make_tls()
        return self._tls

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
            tls = self._tls_context()
            if tls is not None:
                sock = tls.wrap_socket(sock, server_hostname=self._server_hostname)
            sock.settimeout(self._read_timeout)
        except (OSError, ValueError) as exc:
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
        budget = self._budget
        deadline = None if budget is None else time.monotonic() + budget
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
        reader = _Reader(connection.sock, deadline)
        try:
            status, found, data, keep = reader.answer()
        except (OSError, ValueError) as exc:
            connection.close()
            raise ExchangeError("read", exc) from None
        if keep:
            if reader.lowered:
                connection.sock.settimeout(self._read_timeout)
            self._checkin(connection)
        else:
            connection.close()
        return status, found, data

    def close(self) -> None:
        while True:
            try:
                self._idle.pop().close()
            except IndexError:
                return


class _Reader:
    """Reads one answer off a socket: status, headers, body, and whether the
    connection may carry another request. Each ``recv`` asks for at most
    ``_READ_SIZE`` and waits no longer than the read timeout or what is left of
    the exchange's ``deadline`` (monotonic; None: none)."""

    __slots__ = ("deadline", "lowered", "read_timeout", "sock")

    def __init__(self, sock: socket.socket, deadline: float | None) -> None:
        self.sock = sock
        self.deadline = deadline
        self.read_timeout = sock.gettimeout()
        self.lowered = False  # the socket's timeout was cut to the deadline

    def recv(self, size: int = _READ_SIZE) -> bytes:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the answer took longer than the connect and read timeouts")
            timeout = self.read_timeout
            if timeout is None or left < timeout:  # (a syscall: only once it matters)
                self.sock.settimeout(left)
                self.read_timeout = left
                self.lowered = True
        return self.sock.recv(min(size, _READ_SIZE))

    def answer(self) -> tuple[int, dict[str, str], bytes, bool]:
        """An answer of SQS's size usually arrives in one or two reads."""
        data = self.recv()
        if not data:
            raise ConnectionError("the server closed the connection without an answer")
        while True:
            end = data.find(b"\r\n\r\n")
            while end < 0:
                if len(data) > _MAX_HEAD:
                    raise ConnectionError("the answer's headers are too long")
                more = self.recv()
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
            data = data[end + 4 :]
            if 100 <= status < 200 and status != 101:  # interim (100 Continue): the answer follows
                if not data:
                    data = self.recv()
                    if not data:
                        raise ConnectionError(
                            "the server closed the connection after an interim answer"
                        )
                continue
            break
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            key = name.strip().lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        connection = headers.get("connection", "").lower()
        keep = "close" not in connection and (version != "HTTP/1.0" or "keep-alive" in connection)
        body = data
        if status < 200 or status in (204, 304):  # no body (101 is not expected here)
            return status, headers, b"", keep and not body
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return status, headers, self.chunked(body), False
        length = headers.get("content-length")
        if length is None:  # the body runs to the end of the stream
            parts = [body]
            got = len(body)
            while True:
                more = self.recv()
                if not more:
                    return status, headers, b"".join(parts), False
                got += len(more)
                if got > MAX_BODY:
                    raise ConnectionError("the answer's body is longer than leasekeeper reads")
                parts.append(more)
        if not length.strip().isdigit():
            raise ConnectionError("the answer's Content-Length is not a number")
        size = int(length)
        if size > MAX_BODY:
            raise ConnectionError(
                f"the answer announces a body of {size} bytes (leasekeeper reads up to {MAX_BODY})"
            )
        if len(body) < size:
            parts = [body]
            got = len(body)
            while got < size:
                more = self.recv(size - got)
                if not more:
                    raise ConnectionError("the answer ended within its body")
                parts.append(more)
                got += len(more)
            body = b"".join(parts)
        # anything after the body was not asked for: the connection is not reused
        return status, headers, body[:size], keep and len(body) == size

    def chunked(self, data: bytes) -> bytes:
        """A chunked body (``data`` what arrived of it with the headers), read to its
        end; the connection is not reused after one (SQS does not send them)."""
        parts: list[bytes] = []
        total = 0
        while True:
            while b"\r\n" not in data:
                more = self.recv()
                if not more or len(data) > _MAX_HEAD:
                    raise ConnectionError("the answer ended within a chunk")
                data += more
            line, _, data = data.partition(b"\r\n")
            size = int(line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                return b"".join(parts)  # trailers, if any, go with the connection
            total += size
            if total > MAX_BODY:
                raise ConnectionError("the answer's body is longer than leasekeeper reads")
            while len(data) < size + 2:
                more = self.recv(size + 2 - len(data))
                if not more:
                    raise ConnectionError("the answer ended within a chunk")
                data += more
            parts.append(data[:size])
            data = data[size + 2 :]
