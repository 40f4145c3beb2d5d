"""The lean path's connections against a raw socket server, through ``SQSBackend`` on
a boto3 client as users build it: interim answers skipped, a huge announced body
refused without being allocated, an answer trickled in too slowly cut at the
connect and read timeouts added up, an answer cut short and a second answer on
one connection never taken for the next call's, a process holding more than 1,023
descriptors still reusing its connections, a CA bundle that cannot be loaded
leaving the calls to the client (no crash when the backend is made), and the
client's User-Agent on every lean call."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from leasekeeper.backends.sqs import SQSBackend
from leasekeeper.errors import ReceiveError
from tests.sqs.raw_server import RawServer, header, http_answer

REGION = "eu-west-1"
MESSAGE = {
    "MessageId": "m-1",
    "ReceiptHandle": "AQEB" + "r" * 100,
    "MD5OfBody": "x",
    "Body": "job",
    "Attributes": {"ApproximateReceiveCount": "1"},
}
ONE = json.dumps({"Messages": [MESSAGE]}).encode()
DELETED = b'{"Successful":[{"Id":"0"}],"Failed":[]}'


def client_for(url: str, **config: Any) -> Any:
    settings: dict[str, Any] = {
        "retries": {"total_max_attempts": 1, "mode": "standard"},
        "connect_timeout": 1,
        "read_timeout": 1,
    }
    settings.update(config)
    return boto3.client(
        "sqs",
        endpoint_url=url,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(**settings),
    )


@pytest.fixture
def server() -> Iterator[RawServer]:
    with RawServer() as made:
        yield made


def backend_on(server: RawServer, **config: Any) -> SQSBackend:
    backend = SQSBackend(client_for(server.url, **config), f"{server.url}/123456789012/jobs")
    assert backend.lean is not None and backend.lean.usable()
    return backend


def receive(backend: SQSBackend) -> list[Any]:
    return backend.receive(max_messages=10, wait_seconds=0, visibility_timeout=30)


@pytest.mark.parametrize(
    "interim",
    [
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nLink: </x>; rel=preload\r\n\r\n",
    ],
    ids=["100-continue", "three-interim-answers"],
)
def test_an_interim_answer_before_the_answer_still_delivers_its_message(
    server: RawServer, interim: bytes
) -> None:
    backend = backend_on(server)

    def answer_after_a_pause(conn: socket.socket) -> None:
        conn.sendall(interim)
        time.sleep(0.05)  # the interim answer arrives alone
        conn.sendall(http_answer(ONE))

    server.answer(answer_after_a_pause)
    [message] = receive(backend)
    assert (message.id, message.body) == ("m-1", "job")
    server.answer(interim + http_answer(DELETED))  # and in one piece with the answer
    [outcome] = backend.delete([message])
    assert outcome.kind == "ok"
    assert server.connections == 1  # the connection carried both


def test_a_body_of_ten_terabytes_fails_at_once_without_being_allocated(
    server: RawServer,
) -> None:
    backend = backend_on(server, read_timeout=5)
    server.answer(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/x-amz-json-1.0\r\n"
        b"Content-Length: 10000000000000\r\n\r\n" + b'{"Messages":[' + b" " * 1000
    )
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(ReceiveError) as raised:
            receive(backend)
        elapsed = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert raised.value.kind == "retry" and "ConnectionClosedError" in raised.value.detail
    assert elapsed < 5  # within the read timeout
    assert peak < 50_000_000


def test_an_answer_trickled_in_ends_at_the_connect_and_read_timeouts(
    server: RawServer,
) -> None:
    """Slowloris: a byte every 0.1 s never trips the 1 s read timeout (per socket
    operation, as urllib3's), but the exchange ends at connect + read = 2 s."""
    backend = backend_on(server, connect_timeout=1, read_timeout=1)

    def trickle(conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            for byte in http_answer(ONE)[:-1] + b" " * 200:
                conn.sendall(bytes([byte]))
                time.sleep(0.1)

    server.answer(trickle, keep=False)
    started = time.monotonic()
    with pytest.raises(ReceiveError) as raised:
        receive(backend)
    elapsed = time.monotonic() - started
    assert raised.value.kind == "retry" and "ReadTimeoutError" in raised.value.detail
    assert 1.8 < elapsed < 4  # (the answer would take 20 s: it was cut at 2 s)


def test_an_answer_cut_short_is_a_connection_error_and_the_next_call_reconnects(
    server: RawServer,
) -> None:
    backend = backend_on(server)
    server.answer(http_answer(ONE)[:-10], keep=False)
    with pytest.raises(ReceiveError) as raised:
        receive(backend)
    assert raised.value.kind == "retry" and "ConnectionClosedError" in raised.value.detail
    server.answer(http_answer(ONE))
    assert [m.id for m in receive(backend)] == ["m-1"]
    assert server.connections == 2


def test_a_second_answer_on_one_connection_is_never_the_next_calls(
    server: RawServer,
) -> None:
    """A server (or a proxy) that answers twice: the extra answer is not taken for
    the next request's, whether it came with the first or after it."""
    backend = backend_on(server)
    stale = http_answer(json.dumps({"Messages": [{**MESSAGE, "MessageId": "stale"}]}).encode())
    server.answer(http_answer(ONE) + stale)  # both at once
    assert [m.id for m in receive(backend)] == ["m-1"]
    server.answer(http_answer(ONE))
    assert [m.id for m in receive(backend)] == ["m-1"]

    def then_another(conn: socket.socket) -> None:
        conn.sendall(http_answer(ONE))
        time.sleep(0.1)
        conn.sendall(stale)  # while the connection is idle

    server.answer(then_another)
    assert [m.id for m in receive(backend)] == ["m-1"]
    time.sleep(0.3)
    server.answer(http_answer(ONE))
    assert [m.id for m in receive(backend)] == ["m-1"]
    assert server.connections == 3


@contextlib.contextmanager
def descriptors_held(count: int) -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count + 200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 500), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(count)]
    try:
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_in_a_process_holding_1100_descriptors_20_receives_use_at_most_2_connections(
    server: RawServer,
) -> None:
    with descriptors_held(1100):
        backend = backend_on(server)
        for _ in range(20):
            server.answer(http_answer(ONE))
            assert [m.id for m in receive(backend)] == ["m-1"]
    assert server.connections <= 2


def test_a_ca_bundle_that_cannot_be_loaded_leaves_the_calls_to_the_client(
    server: RawServer, tmp_path: Path
) -> None:
    """``verify=`` a directory (or a file that is no CA bundle): the backend is made
    (no IsADirectoryError), the lean path stands aside with the reason, and a call
    fails as the client's own calls fail, per call."""
    garbage = tmp_path / "not-a-bundle.pem"
    garbage.write_text("not a certificate\n")
    for verify in (str(tmp_path), str(garbage)):
        client = boto3.client(
            "sqs",
            endpoint_url=server.url.replace("http:", "https:"),
            region_name=REGION,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            verify=verify,
            config=Config(retries={"total_max_attempts": 1}, connect_timeout=1, read_timeout=1),
        )
        backend = SQSBackend(client, f"{server.url}/123456789012/jobs")
        assert backend.lean is None
        with pytest.raises(ReceiveError) as raised:
            receive(backend)
        assert raised.value.kind == "retry"
        with pytest.raises(Exception) as direct:
            client.receive_message(QueueUrl=f"{server.url}/123456789012/jobs")
        assert type(raised.value.__cause__) is type(direct.value)


def test_every_lean_call_carries_the_clients_user_agent(server: RawServer) -> None:
    backend = backend_on(server, user_agent_extra="billing/7", user_agent_appid="jobs")
    server.answer(http_answer(ONE))
    [message] = receive(backend)
    server.answer(http_answer(DELETED))
    backend.delete([message])
    server.answer(http_answer(b'{"Successful":[{"Id":"0"}],"Failed":[]}'))
    backend.extend([message], 30)
    agents = [str(header(lines, "User-Agent")) for lines, _ in server.requests]
    assert len(agents) == 3
    assert all(a.endswith("billing/7") and " app/jobs " in a for a in agents)
