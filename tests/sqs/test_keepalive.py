"""The lean path's HTTP/1.1 client (backends/sqs/keepalive.py) against a server on
loopback that answers as scripted: a kept-alive connection carries the next call,
one the server closed (at once or while idle) is replaced, bodies of every framing
arrive whole, and a request is not sent twice when its answer never came."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from leasekeeper.backends.sqs.keepalive import ExchangeError, KeepAlivePool

OK = b'{"ok":true}'


class Server:
    """Accepts connections and answers each request read with the next scripted
    answer (bytes to send; ``close`` after it closes the connection)."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        self.answers: list[tuple[bytes, bool]] = []
        self.connections = 0
        self.requests = 0
        self.open: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            self.open.append(conn)
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        # close() at the test's end closes the connection under this thread's recv
        with conn, contextlib.suppress(OSError):
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    more = conn.recv(65536)
                    if not more:
                        return
                    data += more
                head, _, data = data.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                while len(data) < length:
                    data += conn.recv(65536)
                data = data[length:]
                self.requests += 1
                answer, close = self.answers.pop(0)
                conn.sendall(answer)
                if close:
                    return

    def close(self) -> None:
        self.listener.close()
        for conn in self.open:
            conn.close()


@pytest.fixture
def server() -> Iterator[Server]:
    made = Server()
    yield made
    made.close()


def pool_for(server: Server) -> KeepAlivePool:
    return KeepAlivePool(
        "127.0.0.1", server.port, host_header="x", connect_timeout=2, read_timeout=2
    )


def answer(body: bytes = OK, *headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 200 OK\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


def test_a_kept_alive_connection_carries_the_next_calls(server: Server) -> None:
    pool = pool_for(server)
    server.answers += [(answer(), False)] * 3
    for _ in range(3):
        assert pool.post("/", {}, b"{}") == (200, {"content-length": "11"}, OK)
    assert server.connections == 1


def test_connection_close_and_http_1_0_answers_are_not_reused(server: Server) -> None:
    pool = pool_for(server)
    server.answers += [
        (answer(OK, "Connection: close"), True),
        (b"HTTP/1.0 200 OK\r\n\r\n" + OK, True),  # the body runs to the end of the stream
        (answer(OK, "X-Amzn-RequestId: r1"), False),
    ]
    assert pool.post("/", {}, b"{}")[2] == OK
    assert pool.post("/", {}, b"{}") == (200, {}, OK)
    assert pool.post("/", {}, b"{}") == (
        200,
        {"x-amzn-requestid": "r1", "content-length": "11"},
        OK,
    )
    assert server.connections == 3


def test_a_connection_the_server_closed_while_idle_is_replaced(server: Server) -> None:
    pool = pool_for(server)
    server.answers += [(answer(), False), (answer(), False)]
    assert pool.post("/", {}, b"{}")[2] == OK
    server.open[0].shutdown(socket.SHUT_RDWR)  # the server's idle timeout
    assert pool.post("/", {}, b"{}")[2] == OK
    assert server.connections == 2 and server.requests == 2


def test_a_chunked_body_arrives_whole(server: Server) -> None:
    pool = pool_for(server)
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'4\r\n{"ok\r\n7\r\n":true}\r\n0\r\n\r\n'
    )
    server.answers.append((chunked, True))
    assert pool.post("/", {}, b"{}")[2] == OK


def test_a_request_left_without_an_answer_is_not_sent_again(server: Server) -> None:
    pool = pool_for(server)
    server.answers.append((b"", True))  # read the request, close without a word
    with pytest.raises(ExchangeError) as raised:
        pool.post("/", {}, b"{}")
    assert raised.value.phase == "read" and server.requests == 1
