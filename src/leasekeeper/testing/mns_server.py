"""A local Aliyun MNS queue server that the real ``aliyun-mns-sdk`` talks to.

No MNS emulator exists, and a fake that replaces the SDK would test our idea of
the SDK instead of the SDK. This module speaks the MNS 2015-06-06 REST/XML wire
protocol closely enough that ``mns.account.Account("http://127.0.0.1:PORT", id,
key).get_queue(name)`` works unchanged, so backend code runs against the same
request encoding, response parsing and error mapping it meets in production.

What the server enforces, because each point is a client bug it should catch:

* the ``x-mns-version: 2015-06-06`` header, a ``Date`` header, an
  ``Authorization: MNS <AccessKeyId>:<signature>`` header verified with the SDK's
  HMAC-SHA1 algorithm, and ``content-md5`` (base64 of the *hex* MD5 digest of the
  body) on every request that carries a body;
* receipt-handle rotation: every receive and every ChangeMessageVisibility issues
  a new handle and the previous one is dead (400 ``ReceiptHandleError``);
* real visibility timing on an injectable clock, with long polling.

Choices where the service is unspecified or where the test server is simpler:

* A handle that is still the message's newest one keeps working after the
  visibility timeout ran out, as long as nobody received the message again.
  (Alibaba's documentation says the handle "expires" at NextVisibleTime; what the
  live service answers is not documented per code. Azurite behaves the same way
  for Azure, and a backend must handle both outcomes anyway.)
* A handle this server never issued is a 400 ``ReceiptHandleError`` (a real
  handle is an opaque token that fails to decode); a handle of a deleted message
  is a 404 ``MessageNotExist``.
* Issued handles are URL-safe (``1-`` + hex). The SDK sends handles un-encoded,
  so the query string is parsed by hand: ``+ / =`` stay as they are and ``%XX``
  escapes are decoded. A subclass can override ``_new_receipt_handle`` to issue
  real-looking base64 handles.
* Message retention, maximum queue sizes, topics and peek are not implemented.
* Missing/wrong ``x-mns-version`` answers 400 ``InvalidArgument``; a mismatched or
  missing ``content-md5`` answers 400 ``InvalidDegist`` (sic, the service's code).

Logging never includes receipt handles or the access key: request lines are
logged at DEBUG with the ``ReceiptHandle`` value replaced by ``<redacted>``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import heapq
import hmac
import ipaddress
import logging
import re
import signal
import socket
import sys
import threading
import time
import types
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol
from urllib.parse import unquote

__all__ = [
    "FAULT_OPERATIONS",
    "MNSServer",
    "QueueStats",
    "ServerClock",
    "main",
]

logger = logging.getLogger("leasekeeper.testing.mns_server")

MNS_VERSION = "2015-06-06"
XMLNS = "http://mns.aliyuncs.com/doc/v1/"

#: Operations ``MNSServer.fail_next`` can target. "receive" covers single and batch
#: receive, "send" covers single and batch send.
FAULT_OPERATIONS = frozenset(
    {"send", "receive", "change_visibility", "delete", "batch_delete", "create_queue"}
)

_MAX_BATCH = 16
_MAX_WAIT_SECONDS = 30
_MAX_VISIBILITY = 43200
_MAX_DELAY = 604800
_DEFAULT_PRIORITY = 8
_DEFAULT_MAX_MESSAGE_SIZE = 65536
_DEFAULT_RETENTION = 345600
# With an injected clock the server cannot know when time moves, so long-poll
# waiters re-check this often (real seconds) instead of sleeping until a
# computed wake-up time.
_INJECTED_CLOCK_RECHECK = 0.05
_QUEUE_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,255}$")
_REDACT_RE = re.compile(r"(ReceiptHandle=)[^&\s\"]*", re.IGNORECASE)


class ServerClock(Protocol):
    """The time source: ``now()`` monotonic seconds, ``wall()`` epoch seconds."""

    def now(self) -> float: ...

    def wall(self) -> float: ...


class _SystemClock:
    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


@dataclass(frozen=True)
class QueueStats:
    """A snapshot of one queue for test assertions; receipt handles are not exposed.

    ``receive_counts`` maps every message id ever sent (deleted ones included) to
    how often it was received, so a test can assert "delivered exactly once".
    """

    visible: int
    in_flight: int
    delayed: int
    deleted_count: int
    receive_counts: dict[str, int]


class _MNSError(Exception):
    """An error answered as ``<Error>`` XML: code, message and HTTP status."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


def _redact(text: str) -> str:
    return _REDACT_RE.sub(r"\1<redacted>", text)


def _md5_upper_hex(text: str) -> str:
    return hashlib.md5(text.encode("utf-8")).hexdigest().upper()


def _parse_raw_query(query: str) -> dict[str, str]:
    """Split a query string without treating ``+`` as a space.

    The SDK interpolates receipt handles into the URL without encoding them, so a
    real base64 handle arrives with raw ``+ / =``. ``parse_qs`` would turn ``+``
    into a space; ``unquote`` (not ``unquote_plus``) only decodes ``%XX``, which
    keeps clients that do encode working too. Only the first ``=`` separates the
    name from the value, because handles may end in ``==``.
    """
    params: dict[str, str] = {}
    for part in query.split("&"):
        if not part:
            continue
        name, _, value = part.partition("=")
        params[unquote(name)] = unquote(value)
    return params


# A child of a response element: text, or (UserProperties) Name/Value/Type triples.
Child = tuple[str, "str | tuple[tuple[str, str, str], ...]"]
_PROPERTY_FIELDS = ("Name", "Value", "Type")


def _add(parent: ET.Element, children: Iterable[Child]) -> None:
    for name, value in children:
        node = ET.SubElement(parent, name)
        if isinstance(value, str):
            node.text = value
            continue
        for triple in value:
            item = ET.SubElement(node, "PropertyValue")
            for tag, text in zip(_PROPERTY_FIELDS, triple, strict=True):
                ET.SubElement(item, tag).text = text


def _xml(root: str, children: Iterable[Child]) -> bytes:
    """Serialise ``<root xmlns=...><k>v</k>...</root>``.

    The namespace must be a plain default ``xmlns`` attribute: the SDK looks nodes
    up with minidom's ``getElementsByTagName("Message")``, which would not match
    an ElementTree-style ``ns0:Message`` prefix.
    """
    element = ET.Element(root, {"xmlns": XMLNS})
    _add(element, children)
    data: bytes = ET.tostring(element, encoding="utf-8", xml_declaration=True)
    return data


def _xml_list(root: str, item: str, rows: Iterable[Sequence[Child]]) -> bytes:
    element = ET.Element(root, {"xmlns": XMLNS})
    for row in rows:
        _add(ET.SubElement(element, item), row)
    data: bytes = ET.tostring(element, encoding="utf-8", xml_declaration=True)
    return data


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


def _parse_body(body: bytes, expected_roots: Sequence[str]) -> ET.Element:
    try:
        root = ET.fromstring(body)
    except ET.ParseError as exc:
        raise _MNSError(400, "MalformedXML", "The XML you provided was not well-formed.") from exc
    if _local(root.tag) not in expected_roots:
        raise _MNSError(
            400,
            "InvalidArgument",
            f"The XML you provided did not validate against our published schema, "
            f"cause by root element {_local(root.tag)}.",
        )
    return root


def _child_texts(element: ET.Element) -> dict[str, str]:
    return {_local(child.tag): child.text or "" for child in element}


def _properties(element: ET.Element) -> tuple[tuple[str, str, str], ...]:
    """A message's ``<UserProperties><PropertyValue><Name/><Value/><Type/>...``."""
    found: list[tuple[str, str, str]] = []
    for child in element:
        if _local(child.tag) == "UserProperties":
            for value in child:
                fields = _child_texts(value)
                found.append(
                    (fields.get("Name", ""), fields.get("Value", ""), fields.get("Type", ""))
                )
    return tuple(found)


def _int_in_range(name: str, raw: str, low: int, high: int) -> int:
    try:
        value = int(raw.strip())
    except ValueError as exc:
        raise _MNSError(
            400, "InvalidArgument", f"The value of {name} should be an integer."
        ) from exc
    if not low <= value <= high:
        raise _MNSError(
            400,
            "InvalidArgument",
            f"The value of {name} should between {low} and {high} seconds/bytes.",
        )
    return value


@dataclass
class _Message:
    message_id: str
    body: str
    body_md5: str
    priority: int
    seq: int
    enqueue_ms: int
    # Monotonic (clock.now()) time at which the message is visible again.
    next_visible: float
    # Epoch milliseconds reported for next_visible.
    next_visible_ms: int
    first_dequeue_ms: int = 0
    dequeue_count: int = 0
    # UserProperties as sent: (Name, Value, Type) each, returned with every receive.
    properties: tuple[tuple[str, str, str], ...] = ()
    # Bumped whenever next_visible changes, so heap entries from before the change
    # are recognised as stale and skipped instead of being searched for.
    generation: int = 0
    handle: str = ""


@dataclass
class _QueueAttributes:
    visibility_timeout: int = 30
    polling_wait_seconds: int = 0
    delay_seconds: int = 0
    maximum_message_size: int = _DEFAULT_MAX_MESSAGE_SIZE
    message_retention_period: int = _DEFAULT_RETENTION
    logging_enabled: bool = False


_ATTRIBUTE_FIELDS: dict[str, tuple[str, int, int]] = {
    # XML element: (attribute, low, high)
    "VisibilityTimeout": ("visibility_timeout", 1, _MAX_VISIBILITY),
    "PollingWaitSeconds": ("polling_wait_seconds", 0, _MAX_WAIT_SECONDS),
    "DelaySeconds": ("delay_seconds", 0, _MAX_DELAY),
    "MaximumMessageSize": ("maximum_message_size", 1024, _DEFAULT_MAX_MESSAGE_SIZE),
    "MessageRetentionPeriod": ("message_retention_period", 60, 604800),
}


@dataclass
class _Queue:
    name: str
    attributes: _QueueAttributes
    condition: threading.Condition
    created_ms: int
    modified_ms: int
    messages: dict[str, _Message] = field(default_factory=dict)
    # Every handle ever issued -> message id. Lets a handle of a deleted message
    # be told apart from one this server never issued. Grows with the number of
    # receives, which is fine for a test server.
    handles: dict[str, str] = field(default_factory=dict)
    # (priority, seq, message id, generation) of messages believed visible.
    ready: list[tuple[int, int, str, int]] = field(default_factory=list)
    # (next visible time, seq, message id, generation) of hidden messages.
    hidden: list[tuple[float, int, str, int]] = field(default_factory=list)
    deleted_count: int = 0
    receive_counts: dict[str, int] = field(default_factory=dict)
    deleted: bool = False

    def promote(self, now: float) -> None:
        """Move messages whose visibility ran out from ``hidden`` to ``ready``.

        Done lazily on every access: cost is proportional to the messages that
        changed state, not to the queue length.
        """
        while self.hidden and self.hidden[0][0] <= now:
            _, seq, message_id, generation = heapq.heappop(self.hidden)
            message = self.messages.get(message_id)
            if message is not None and message.generation == generation:
                heapq.heappush(self.ready, (message.priority, seq, message_id, generation))

    def next_hidden_time(self) -> float | None:
        """When the earliest hidden message becomes visible (stale entries dropped)."""
        while self.hidden:
            _, _, message_id, generation = self.hidden[0]
            message = self.messages.get(message_id)
            if message is not None and message.generation == generation:
                return self.hidden[0][0]
            heapq.heappop(self.hidden)
        return None

    def pop_visible(self) -> _Message | None:
        while self.ready:
            _, _, message_id, generation = heapq.heappop(self.ready)
            message = self.messages.get(message_id)
            if message is not None and message.generation == generation:
                return message
        return None

    def hide(self, message: _Message, until: float, until_ms: int) -> None:
        message.generation += 1
        message.next_visible = until
        message.next_visible_ms = until_ms
        heapq.heappush(self.hidden, (until, message.seq, message.message_id, message.generation))


@dataclass
class _Fault:
    code: str
    status: int
    message: str
    remaining: int


@dataclass
class _Response:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default listen backlog is 5. Clients that open their first
    # connection at the same moment (a backend's per-thread clients: a dispatch
    # pool, handler threads finishing together) overflow it, the kernel drops their
    # SYNs and they retry after 1 s: a stall no real MNS endpoint shows, long
    # enough to make a 2 s lease lapse.
    request_queue_size = 128
    mns: MNSServer

    def handle_error(self, request: object, client_address: object) -> None:
        # The default prints a traceback to stderr. Clients resetting a keep-alive
        # connection (or stop() shutting it down) is routine, not a server fault.
        logger.debug("connection from %s ended with an error", client_address, exc_info=True)


class _HTTPServer6(_HTTPServer):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 keeps the connection open: the SDK holds one persistent connection.
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; with Nagle on, the body waits for the
    # client's delayed ACK (~40 ms a response).
    disable_nagle_algorithm = True
    server_version = "leasekeeper-mns-test-server"

    def version_string(self) -> str:
        return self.server_version

    @property
    def _mns(self) -> MNSServer:
        server = self.server
        assert isinstance(server, _HTTPServer)
        return server.mns

    def setup(self) -> None:
        super().setup()
        self._mns._track_connection(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self._mns._track_connection(self.connection, add=False)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        request_id = uuid.uuid4().hex[:24].upper()
        mns = self._mns
        try:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError as exc:
                self.close_connection = True
                raise _MNSError(400, "InvalidArgument", "Bad Content-Length.") from exc
            body = self.rfile.read(length) if length > 0 else b""
            # Lower-cased names: the SDK sends "x-mns-version" and "Authorization"
            # alike, and the signature canonicalises x-mns-* names in lower case.
            headers = {name.lower(): value for name, value in self.headers.items()}
            response = mns._handle(method, self.path, headers, body, request_id)
        except _MNSError as exc:
            response = mns._error_response(exc, request_id)
        except Exception:
            logger.exception("MNS test server failed on %s %s", method, _redact(self.path))
            response = mns._error_response(
                _MNSError(500, "InternalError", "Interal error."), request_id
            )
        self._send(response, request_id)

    def _send(self, response: _Response, request_id: str) -> None:
        self.send_response(response.status)
        # Exact lower-case name: the SDK reads resp.header["x-mns-request-id"]
        # from a plain dict when a batch-delete error carries no RequestId.
        self.send_header("x-mns-request-id", request_id)
        self.send_header("x-mns-version", MNS_VERSION)
        for name, value in response.headers.items():
            self.send_header(name, value)
        if response.body:
            self.send_header("Content-Type", "text/xml;charset=utf-8")
        self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        if response.body:
            self.wfile.write(response.body)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Answer malformed HTTP (bad request line, unknown method) as MNS error XML.

        The default is an HTML page, which the SDK reports as RespDataDamaged; XML
        keeps the client's error mapping intact.
        """
        request_id = uuid.uuid4().hex[:24].upper()
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = "Error"
        self.close_connection = True
        response = self._mns._error_response(
            _MNSError(code, phrase.replace(" ", ""), message or phrase), request_id
        )
        response.headers["Connection"] = "close"
        self._send(response, request_id)

    def log_message(self, format: str, *args: object) -> None:
        # The default writes the request line (receipt handle included) to stderr.
        logger.debug("%s %s", self.address_string(), _redact(format % args))


class MNSServer:
    """A loopback-only MNS queue server for tests; see the module docstring.

    Use as a context manager (``with MNSServer() as server:``) or call
    ``start()`` / ``stop()``. ``endpoint`` is the URL to give ``mns.account.Account``.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        access_id: str = "test-id",
        access_key: str = "test-key",
        clock: ServerClock | None = None,
    ) -> None:
        self._host, self._family = self._check_loopback(host)
        self._requested_port = port
        self._access_id = access_id
        self._access_key = access_key
        self._clock: ServerClock = clock if clock is not None else _SystemClock()
        # Exact sleeps until the next message becomes visible are only possible when
        # the clock is the real one; an injected clock may jump at any moment.
        self._exact_waits = clock is None
        self._lock = threading.Lock()
        self._queues: dict[str, _Queue] = {}
        self._faults: dict[str, list[_Fault]] = {}
        self._seq = 0
        self._stopping = False
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()

    def __repr__(self) -> str:
        # No access key here: reprs end up in test failure output and logs.
        state = self.endpoint if self._httpd is not None else "not started"
        return f"MNSServer({state}, access_id={self._access_id!r})"

    # ------------------------------------------------------------------ lifecycle

    @staticmethod
    def _check_loopback(host: str) -> tuple[str, socket.AddressFamily]:
        """Refuse anything but loopback: the server has test credentials and no TLS."""
        if host == "localhost":
            return "127.0.0.1", socket.AF_INET
        try:
            address = ipaddress.ip_address(host)
        except ValueError as exc:
            raise ValueError(
                f"MNSServer binds to loopback only; {host!r} is not an IP address"
            ) from exc
        if not address.is_loopback:
            raise ValueError(f"MNSServer binds to loopback only; {host!r} is not loopback")
        family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
        return str(address), family

    def start(self) -> MNSServer:
        """Bind and serve in a daemon thread. Returns self for chaining."""
        if self._httpd is not None:
            raise RuntimeError("MNSServer already started")
        server_class = _HTTPServer6 if self._family == socket.AF_INET6 else _HTTPServer
        httpd = server_class((self._host, self._requested_port), _Handler)
        httpd.mns = self
        self._stopping = False
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"mns-test-server-{self.port}",
            daemon=True,
        )
        self._thread.start()
        logger.info("MNS test server listening on %s (loopback only)", self.endpoint)
        return self

    def stop(self) -> None:
        """Stop serving, end long polls and close open keep-alive connections."""
        httpd = self._httpd
        if httpd is None:
            return
        with self._lock:
            self._stopping = True
            for queue in self._queues.values():
                queue.condition.notify_all()
        httpd.shutdown()
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            # Handler threads block reading the next request of a keep-alive
            # connection; shutting the socket down ends them now, not when the
            # client goes away.
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None
        logger.info("MNS test server stopped")

    def __enter__(self) -> MNSServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("MNSServer is not started")
        return int(self._httpd.server_address[1])

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT``, the form ``mns.account.Account`` expects."""
        host = f"[{self._host}]" if self._family == socket.AF_INET6 else self._host
        return f"http://{host}:{self.port}"

    def _track_connection(self, connection: socket.socket, *, add: bool) -> None:
        with self._connections_lock:
            if add:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)

    # ------------------------------------------------------------ direct test API

    def create_queue(
        self,
        name: str,
        visibility_timeout: int = 30,
        *,
        polling_wait_seconds: int = 0,
        delay_seconds: int = 0,
    ) -> None:
        """Create a queue without HTTP. Idempotent for identical attributes."""
        if not _QUEUE_NAME_RE.match(name):
            raise ValueError(f"invalid MNS queue name {name!r}")
        values = {
            "VisibilityTimeout": visibility_timeout,
            "PollingWaitSeconds": polling_wait_seconds,
            "DelaySeconds": delay_seconds,
        }
        for element, value in values.items():
            _, low, high = _ATTRIBUTE_FIELDS[element]
            if not low <= value <= high:
                raise ValueError(f"{element} must be between {low} and {high}, got {value}")
        with self._lock:
            try:
                self._create_locked(name, {k: str(v) for k, v in values.items()})
            except _MNSError as exc:
                raise ValueError(exc.message) from exc

    def queue_stats(self, name: str) -> QueueStats:
        with self._lock:
            queue = self._queues.get(name)
            if queue is None:
                raise KeyError(name)
            now = self._clock.now()
            visible = in_flight = delayed = 0
            for message in queue.messages.values():
                if message.next_visible <= now:
                    visible += 1
                elif message.dequeue_count > 0:
                    in_flight += 1
                else:
                    delayed += 1
            return QueueStats(
                visible=visible,
                in_flight=in_flight,
                delayed=delayed,
                deleted_count=queue.deleted_count,
                receive_counts=dict(queue.receive_counts),
            )

    def fail_next(
        self,
        operation: str,
        code: str,
        status: int,
        count: int = 1,
        *,
        message: str = "Injected by MNSServer.fail_next.",
    ) -> None:
        """Answer the next ``count`` requests of ``operation`` with this error.

        The failed request has no effect on the queue. Faults for one operation
        queue up in call order. ``operation`` is one of ``FAULT_OPERATIONS``.
        """
        if operation not in FAULT_OPERATIONS:
            raise ValueError(
                f"unknown operation {operation!r}; expected one of {sorted(FAULT_OPERATIONS)}"
            )
        if not 400 <= status <= 599:
            raise ValueError("status must be a 4xx or 5xx HTTP status")
        if count < 1:
            raise ValueError("count must be at least 1")
        with self._lock:
            self._faults.setdefault(operation, []).append(_Fault(code, status, message, count))

    def wake_waiters(self) -> None:
        """Re-check long polls now, e.g. right after advancing an injected clock."""
        with self._lock:
            for queue in self._queues.values():
                queue.condition.notify_all()

    def _new_receipt_handle(self) -> str:
        """A fresh handle. URL-safe so that clients that do encode it still match."""
        return "1-" + uuid.uuid4().hex

    # --------------------------------------------------------------- HTTP layer

    def _error_response(self, exc: _MNSError, request_id: str) -> _Response:
        body = _xml(
            "Error",
            [
                ("Code", exc.code),
                ("Message", exc.message),
                ("RequestId", request_id),
                ("HostId", self.endpoint),
            ],
        )
        return _Response(exc.status, body)

    def _authenticate(
        self, method: str, raw_path: str, headers: dict[str, str], body: bytes
    ) -> None:
        version = headers.get("x-mns-version")
        if version is None:
            raise _MNSError(400, "InvalidArgument", "The x-mns-version header is required.")
        if version != MNS_VERSION:
            raise _MNSError(400, "InvalidArgument", f"Unsupported x-mns-version {version!r}.")
        date = headers.get("date")
        if not date:
            raise _MNSError(400, "MissingDateHeader", "Date header is required.")
        content_md5 = headers.get("content-md5") or ""
        if body:
            expected = base64.b64encode(hashlib.md5(body).hexdigest().encode()).decode()
            if content_md5 != expected:
                raise _MNSError(400, "InvalidDegist", "The Content-MD5 you specified is invalid.")
        authorization = headers.get("authorization")
        if not authorization:
            raise _MNSError(400, "MissingAuthorizationHeader", "Authorization header is required.")
        scheme, _, credential = authorization.partition(" ")
        access_id, sep, signature = credential.partition(":")
        if scheme != "MNS" or not sep or not access_id or not signature:
            raise _MNSError(
                400, "InvalidAuthorizationHeader", "The Authorization header format is invalid."
            )
        if access_id != self._access_id:
            raise _MNSError(
                403, "InvalidAccessKeyId", "The AccessKey Id you provided is not exist."
            )
        # Same string-to-sign as mns_client.MNSClient.get_signature: the canonical
        # resource is the request target exactly as sent, query string included.
        mns_headers = "".join(
            f"{name}:{headers.get(name)}\n" for name in sorted(headers) if name.startswith("x-mns-")
        )
        string_to_sign = (
            f"{method}\n{content_md5}\n{headers.get('content-type') or ''}\n{date}\n"
            f"{mns_headers}{raw_path}"
        )
        digest = hmac.new(
            self._access_key.encode("utf-8"), string_to_sign.encode("utf-8"), hashlib.sha1
        ).digest()
        if not hmac.compare_digest(base64.b64encode(digest).decode(), signature):
            raise _MNSError(
                403,
                "SignatureDoesNotMatch",
                "The request signature we calculated does not match the signature you "
                "provided. Check your key and signing method.",
            )

    def _handle(
        self, method: str, raw_path: str, headers: dict[str, str], body: bytes, request_id: str
    ) -> _Response:
        self._authenticate(method, raw_path, headers, body)
        path, _, query = raw_path.partition("?")
        params = _parse_raw_query(query)
        parts = [unquote(part) for part in path.strip("/").split("/")]
        route: tuple[str, ...] = ()
        if len(parts) == 2 and parts[0] == "queues":
            route = (method, "queue")
        elif len(parts) == 3 and parts[0] == "queues" and parts[2] == "messages":
            route = (method, "messages")
        name = parts[1] if route else ""
        handlers: dict[tuple[str, ...], Callable[[], _Response]] = {
            ("PUT", "queue"): lambda: (
                self._set_attributes(name, body)
                if params.get("metaoverride") == "true"
                else self._create_queue_http(name, body)
            ),
            ("GET", "queue"): lambda: self._get_attributes(name),
            ("DELETE", "queue"): lambda: self._delete_queue(name),
            ("POST", "messages"): lambda: self._send(name, body),
            ("GET", "messages"): lambda: self._receive(name, params),
            ("PUT", "messages"): lambda: self._change_visibility(name, params),
            # Both deletes share the URL; only batch delete has a body.
            ("DELETE", "messages"): lambda: (
                self._batch_delete(name, body) if body else self._delete(name, params)
            ),
        }
        handler = handlers.get(route)
        if handler is not None:
            return handler()
        raise _MNSError(400, "InvalidRequestURL", "Http request URL format invalid.")

    def _check_fault(self, operation: str) -> None:
        """Raise the next injected fault for ``operation``; caller holds the lock."""
        faults = self._faults.get(operation)
        if not faults:
            return
        fault = faults[0]
        fault.remaining -= 1
        if fault.remaining <= 0:
            faults.pop(0)
        raise _MNSError(fault.status, fault.code, fault.message)

    def _queue(self, name: str) -> _Queue:
        queue = self._queues.get(name)
        if queue is None:
            raise _MNSError(404, "QueueNotExist", "The queue name you provided is not exist.")
        return queue

    def _now_ms(self) -> int:
        return int(self._clock.wall() * 1000)

    # ------------------------------------------------------------- queue admin

    def _parse_attributes(self, body: bytes) -> dict[str, str]:
        if not body:
            return {}
        return _child_texts(_parse_body(body, ["Queue"]))

    def _create_locked(self, name: str, fields: dict[str, str]) -> bool:
        """Create ``name``; True if created, False if it existed with the same values."""
        if not 1 <= len(name) <= 256:
            raise _MNSError(
                400, "QueueNameLengthError", "The length of queue name should be 1 to 256."
            )
        if not _QUEUE_NAME_RE.match(name):
            raise _MNSError(
                400,
                "InvalidQueueName",
                "The queue name you provided is not valid: start with a letter, then "
                "letters, digits or '-'.",
            )
        attributes = _QueueAttributes()
        self._apply_attributes(attributes, fields)
        existing = self._queues.get(name)
        if existing is not None:
            # Compare only what the request specified, so a bare create of an
            # existing queue is the documented "same attributes" 204.
            requested = {
                attr: getattr(attributes, attr)
                for element, (attr, _, _) in _ATTRIBUTE_FIELDS.items()
                if element in fields
            }
            if any(getattr(existing.attributes, a) != v for a, v in requested.items()):
                raise _MNSError(
                    409,
                    "QueueAlreadyExist",
                    "The queue you want to create is already exist with different attributes.",
                )
            return False
        now_ms = self._now_ms()
        self._queues[name] = _Queue(
            name=name,
            attributes=attributes,
            condition=threading.Condition(self._lock),
            created_ms=now_ms,
            modified_ms=now_ms,
        )
        return True

    @staticmethod
    def _apply_attributes(attributes: _QueueAttributes, fields: dict[str, str]) -> None:
        for element, (attr, low, high) in _ATTRIBUTE_FIELDS.items():
            if element in fields:
                setattr(attributes, attr, _int_in_range(element, fields[element], low, high))
        # Unknown elements (LoggingEnabled, future fields) are accepted and ignored,
        # except LoggingEnabled which GetQueueAttributes reports back.
        if "LoggingEnabled" in fields:
            attributes.logging_enabled = fields["LoggingEnabled"].strip().lower() == "true"

    def _create_queue_http(self, name: str, body: bytes) -> _Response:
        fields = self._parse_attributes(body)
        with self._lock:
            self._check_fault("create_queue")
            created = self._create_locked(name, fields)
        headers = {"Location": f"{self.endpoint}/queues/{name}"}
        # The SDK reads the Location header for 201 and 204 alike.
        return _Response(201 if created else 204, headers=headers)

    def _set_attributes(self, name: str, body: bytes) -> _Response:
        fields = self._parse_attributes(body)
        with self._lock:
            queue = self._queue(name)
            updated = _QueueAttributes(**vars(queue.attributes))
            self._apply_attributes(updated, fields)
            queue.attributes = updated
            queue.modified_ms = self._now_ms()
        return _Response(204)

    def _get_attributes(self, name: str) -> _Response:
        with self._lock:
            queue = self._queue(name)
            now = self._clock.now()
            queue.promote(now)
            active = inactive = delayed = 0
            for message in queue.messages.values():
                if message.next_visible <= now:
                    active += 1
                elif message.dequeue_count > 0:
                    inactive += 1
                else:
                    delayed += 1
            attributes = queue.attributes
            rows = [
                ("QueueName", queue.name),
                ("CreateTime", str(queue.created_ms // 1000)),
                ("LastModifyTime", str(queue.modified_ms // 1000)),
                ("VisibilityTimeout", str(attributes.visibility_timeout)),
                ("MaximumMessageSize", str(attributes.maximum_message_size)),
                ("MessageRetentionPeriod", str(attributes.message_retention_period)),
                ("DelaySeconds", str(attributes.delay_seconds)),
                ("PollingWaitSeconds", str(attributes.polling_wait_seconds)),
                ("ActiveMessages", str(active)),
                ("InactiveMessages", str(inactive)),
                ("DelayMessages", str(delayed)),
                ("LoggingEnabled", "True" if attributes.logging_enabled else "False"),
            ]
        return _Response(200, _xml("Queue", rows))

    def _delete_queue(self, name: str) -> _Response:
        with self._lock:
            queue = self._queues.pop(name, None)
            if queue is not None:
                queue.deleted = True
                # Long polls on the queue answer QueueNotExist right away.
                queue.condition.notify_all()
        return _Response(204)

    # ------------------------------------------------------------------ messages

    def _new_message(self, queue: _Queue, fields: dict[str, str], now: float) -> _Message:
        body = fields.get("MessageBody", "")
        if not body:
            raise _MNSError(400, "InvalidArgument", "MessageBody is required.")
        if len(body.encode("utf-8")) > queue.attributes.maximum_message_size:
            raise _MNSError(
                400,
                "InvalidArgument",
                f"The value of MessageBody should between 1 and "
                f"{queue.attributes.maximum_message_size} seconds/bytes.",
            )
        delay = queue.attributes.delay_seconds
        if "DelaySeconds" in fields:
            delay = _int_in_range("DelaySeconds", fields["DelaySeconds"], 0, _MAX_DELAY)
        priority = _DEFAULT_PRIORITY
        if "Priority" in fields:
            priority = _int_in_range("Priority", fields["Priority"], 1, 16)
        self._seq += 1
        now_ms = self._now_ms()
        message = _Message(
            message_id=uuid.uuid4().hex.upper(),
            # Stored exactly as sent (base64 text by default) and returned exactly:
            # decoding is the SDK's business, and the MD5 is of this text.
            body=body,
            body_md5=_md5_upper_hex(body),
            priority=priority,
            seq=self._seq,
            enqueue_ms=now_ms,
            next_visible=now + delay,
            next_visible_ms=now_ms + delay * 1000,
        )
        queue.messages[message.message_id] = message
        queue.receive_counts[message.message_id] = 0
        if delay > 0:
            heapq.heappush(queue.hidden, (message.next_visible, message.seq, message.message_id, 0))
        else:
            heapq.heappush(queue.ready, (priority, message.seq, message.message_id, 0))
        return message

    def _send(self, name: str, body: bytes) -> _Response:
        root = _parse_body(body, ["Message", "Messages"])
        batch = _local(root.tag) == "Messages"
        elements = list(root) if batch else [root]
        entries = [_child_texts(element) for element in elements]
        if batch and not 1 <= len(entries) <= _MAX_BATCH:
            raise _MNSError(
                400, "InvalidArgument", f"The count of messages should between 1 and {_MAX_BATCH}."
            )
        with self._lock:
            self._check_fault("send")
            queue = self._queue(name)
            now = self._clock.now()
            # Validate every entry before storing any, so a bad batch stores nothing.
            sent = [self._new_message(queue, entry, now) for entry in entries]
            for message, element in zip(sent, elements, strict=True):
                message.properties = _properties(element)
            queue.condition.notify_all()
        rows = [[("MessageId", m.message_id), ("MessageBodyMD5", m.body_md5)] for m in sent]
        if batch:
            return _Response(201, _xml_list("Messages", "Message", rows))
        return _Response(201, _xml("Message", rows[0]))

    def _receive(self, name: str, params: dict[str, str]) -> _Response:
        if params.get("peekonly", "").lower() == "true":
            raise _MNSError(400, "InvalidArgument", "PeekMessage is not supported here.")
        batch = "numOfMessages" in params
        count = (
            _int_in_range("numOfMessages", params["numOfMessages"], 1, _MAX_BATCH) if batch else 1
        )
        with self._lock:
            self._check_fault("receive")
            queue = self._queue(name)
            if "waitseconds" in params:
                wait = _int_in_range("waitseconds", params["waitseconds"], 0, _MAX_WAIT_SECONDS)
            else:
                wait = queue.attributes.polling_wait_seconds
            taken = self._take_with_wait(queue, count, wait)
        if not taken:
            raise _MNSError(404, "MessageNotExist", "Message not exist.")
        rows = [self._message_row(message, handle) for message, handle in taken]
        if batch:
            return _Response(200, _xml_list("Messages", "Message", rows))
        return _Response(200, _xml("Message", rows[0]))

    def _take_with_wait(self, queue: _Queue, count: int, wait: int) -> list[tuple[_Message, str]]:
        """Take up to ``count`` visible messages, long-polling up to ``wait`` seconds.

        Caller holds the lock. The deadline counts on both the real monotonic clock
        and the injected one: a frozen fake clock must not hang a request, and a
        fake clock advanced past the deadline ends it early.
        """
        real_deadline = time.monotonic() + wait
        clock_deadline = self._clock.now() + wait
        while True:
            if queue.deleted:
                raise _MNSError(404, "QueueNotExist", "The queue name you provided is not exist.")
            if self._stopping:
                raise _MNSError(503, "ServiceUnavailable", "The test server is stopping.")
            now = self._clock.now()
            taken = self._take(queue, count, now)
            remaining = min(real_deadline - time.monotonic(), clock_deadline - now)
            if taken or remaining <= 0:
                return taken
            timeout = remaining
            if self._exact_waits:
                next_visible = queue.next_hidden_time()
                if next_visible is not None:
                    timeout = min(timeout, max(next_visible - now, 0.001))
            else:
                timeout = min(timeout, _INJECTED_CLOCK_RECHECK)
            queue.condition.wait(timeout)

    def _take(self, queue: _Queue, count: int, now: float) -> list[tuple[_Message, str]]:
        queue.promote(now)
        taken: list[tuple[_Message, str]] = []
        now_ms = self._now_ms()
        timeout = queue.attributes.visibility_timeout
        while len(taken) < count:
            message = queue.pop_visible()
            if message is None:
                break
            message.dequeue_count += 1
            queue.receive_counts[message.message_id] = message.dequeue_count
            if message.first_dequeue_ms == 0:
                message.first_dequeue_ms = now_ms
            handle = self._issue_handle(queue, message)
            queue.hide(message, now + timeout, now_ms + timeout * 1000)
            taken.append((message, handle))
        return taken

    def _issue_handle(self, queue: _Queue, message: _Message) -> str:
        handle = self._new_receipt_handle()
        while handle in queue.handles:
            handle = self._new_receipt_handle()
        queue.handles[handle] = message.message_id
        message.handle = handle
        return handle

    @staticmethod
    def _message_row(message: _Message, handle: str) -> list[Child]:
        # All nine fields: the SDK reports RespDataDamaged if any one is missing.
        row: list[Child] = [
            ("MessageId", message.message_id),
            ("ReceiptHandle", handle),
            ("MessageBodyMD5", message.body_md5),
            ("MessageBody", message.body),
            ("EnqueueTime", str(message.enqueue_ms)),
            ("NextVisibleTime", str(message.next_visible_ms)),
            ("FirstDequeueTime", str(message.first_dequeue_ms)),
            ("DequeueCount", str(message.dequeue_count)),
            ("Priority", str(message.priority)),
        ]
        if message.properties:
            row.append(("UserProperties", message.properties))
        return row

    def _resolve(self, queue: _Queue, handle: str) -> _Message:
        """The message whose *current* handle is ``handle``, or the matching error."""
        message_id = queue.handles.get(handle)
        if message_id is None:
            raise _MNSError(
                400, "ReceiptHandleError", "The receipt handle you provided is not valid."
            )
        message = queue.messages.get(message_id)
        if message is None:
            raise _MNSError(404, "MessageNotExist", "Message not exist.")
        if message.handle != handle:
            # Rotated out by a later receive or ChangeMessageVisibility.
            raise _MNSError(
                400, "ReceiptHandleError", "The receipt handle you provided is not valid."
            )
        return message

    @staticmethod
    def _required_handle(params: dict[str, str]) -> str:
        handle = params.get("ReceiptHandle", "")
        if not handle:
            raise _MNSError(400, "MissingReceiptHandle", "ReceiptHandle is required.")
        return handle

    def _change_visibility(self, name: str, params: dict[str, str]) -> _Response:
        handle = self._required_handle(params)
        if "VisibilityTimeout" not in params:
            raise _MNSError(400, "MissingVisibilityTimeout", "VisibilityTimeout is required.")
        timeout = _int_in_range(
            "VisibilityTimeout", params["VisibilityTimeout"], 1, _MAX_VISIBILITY
        )
        with self._lock:
            self._check_fault("change_visibility")
            queue = self._queue(name)
            message = self._resolve(queue, handle)
            now = self._clock.now()
            new_handle = self._issue_handle(queue, message)
            queue.hide(message, now + timeout, self._now_ms() + timeout * 1000)
            # A shorter timeout can make the message visible sooner than a waiter's
            # computed wake-up time.
            queue.condition.notify_all()
            rows = [
                ("ReceiptHandle", new_handle),
                ("NextVisibleTime", str(message.next_visible_ms)),
            ]
        return _Response(200, _xml("ChangeVisibility", rows))

    def _delete_locked(self, queue: _Queue, handle: str) -> None:
        message = self._resolve(queue, handle)
        del queue.messages[message.message_id]
        queue.deleted_count += 1

    def _delete(self, name: str, params: dict[str, str]) -> _Response:
        handle = self._required_handle(params)
        with self._lock:
            self._check_fault("delete")
            self._delete_locked(self._queue(name), handle)
        return _Response(204)

    def _batch_delete(self, name: str, body: bytes) -> _Response:
        root = _parse_body(body, ["ReceiptHandles"])
        handles = [
            (child.text or "").strip() for child in root if _local(child.tag) == "ReceiptHandle"
        ]
        if not 1 <= len(handles) <= _MAX_BATCH:
            raise _MNSError(
                400,
                "InvalidArgument",
                f"The count of receipt handles should between 1 and {_MAX_BATCH}.",
            )
        errors: list[list[tuple[str, str]]] = []
        with self._lock:
            self._check_fault("batch_delete")
            queue = self._queue(name)
            for handle in handles:
                if not handle:
                    errors.append(
                        [
                            ("ErrorCode", "MissingReceiptHandle"),
                            ("ErrorMessage", "ReceiptHandle is required."),
                            # The SDK drops empty elements and then calls the reply
                            # damaged, so an empty handle is echoed as a placeholder.
                            ("ReceiptHandle", "(empty)"),
                        ]
                    )
                    continue
                try:
                    self._delete_locked(queue, handle)
                except _MNSError as exc:
                    errors.append(
                        [
                            ("ErrorCode", exc.code),
                            ("ErrorMessage", exc.message),
                            ("ReceiptHandle", handle),
                        ]
                    )
        if not errors:
            return _Response(204)
        # Successful entries stay deleted; only the failures are listed.
        return _Response(404, _xml_list("Errors", "Error", errors))


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until Ctrl-C or SIGTERM; print the endpoint once it is listening."""
    parser = argparse.ArgumentParser(
        prog="python -m leasekeeper.testing.mns_server",
        description="Local Aliyun MNS server for tests (loopback only).",
    )
    parser.add_argument("--port", type=int, default=0, help="port, 0 for any free one")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to bind")
    parser.add_argument("--access-id", default="test-id")
    parser.add_argument("--access-key", default="test-key")
    parser.add_argument(
        "--queue", action="append", default=[], metavar="NAME", help="create this queue at start"
    )
    parser.add_argument("--visibility-timeout", type=int, default=30, help="for --queue queues")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s"
    )

    try:
        server = MNSServer(
            args.host, args.port, access_id=args.access_id, access_key=args.access_key
        )
    except ValueError as exc:
        parser.error(str(exc))
    stop = threading.Event()

    def on_sigterm(signum: int, frame: types.FrameType | None) -> None:
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        with server:
            for name in args.queue:
                server.create_queue(name, args.visibility_timeout)
            sys.stdout.write(server.endpoint + "\n")  # the CLI's output: the endpoint
            sys.stdout.flush()
            # Short waits keep the main thread responsive to Ctrl-C.
            while not stop.wait(0.5):
                pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
