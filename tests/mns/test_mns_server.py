"""The local MNS server, driven through the real aliyun-mns-sdk.

Every test talks to ``leasekeeper.testing.mns_server.MNSServer`` through
``mns.account.Account`` exactly as a backend would; raw ``http.client`` requests
are used only where the SDK cannot say something (a handle with raw ``+ / =``
typed by hand, a bad Content-MD5, a missing Authorization header). Raw requests
are signed with the SDK's own ``MNSClient.build_header`` so they differ from the
SDK's only where a test changes them on purpose.

Thread-safety, observed against this server (aliyun-mns-sdk 1.3.0): every
``Queue`` from one ``Account`` shares the Account's single ``MNSClient`` and so
its single ``HTTPConnection`` (``acc.get_queue("a").mns_client is
acc.get_queue("b").mns_client``). Two threads doing send+receive through two
queues of one Account failed most calls within 200 iterations each:
``NetWorkException`` with "Request-sent", "Idle", "'NoneType' object has no
attribute 'setsockopt'" / "'close'", "Bad file descriptor", "Broken pipe",
timeouts, responses delivered to the wrong caller (``RespDataDamaged``) and
interleaved request bodies that the server rejected as ``InvalidDegist``. One
``Account`` per thread ran the same load with no error
(``test_one_account_per_thread_is_safe``). The unsafe variant is not a test: its
failures are nondeterministic and can stall for the connection timeout.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import types
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import mns.account as mns_account  # a missing SDK fails loudly, never skips
import pytest
from mns.mns_client import MNSClient
from mns.mns_exception import MNSServerException
from mns.mns_http import RequestInternal
from mns.queue import Message, QueueMeta

from leasekeeper.testing.mns_server import MNSServer

Account = mns_account.Account
QUEUE = "jobs"
SRC = Path(__file__).resolve().parents[2] / "src"


class FakeClock:
    """Just ``now()`` and ``wall()``: what MNSServer needs, moved by hand."""

    def __init__(self) -> None:
        self._now = 1000.0
        self._wall = 1_700_000_000.0

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._wall

    def advance(self, seconds: float) -> None:
        self._now += seconds
        self._wall += seconds


@pytest.fixture
def server() -> Iterator[MNSServer]:
    with MNSServer() as srv:
        srv.create_queue(QUEUE, visibility_timeout=30)
        yield srv


@pytest.fixture
def queue(server: MNSServer) -> Any:
    return Account(server.endpoint, "test-id", "test-key").get_queue(QUEUE)


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def faked(fake_clock: FakeClock) -> Iterator[MNSServer]:
    with MNSServer(clock=fake_clock) as srv:
        srv.create_queue(QUEUE, visibility_timeout=30)
        yield srv


@pytest.fixture
def fqueue(faked: MNSServer) -> Any:
    return Account(faked.endpoint, "test-id", "test-key").get_queue(QUEUE)


def error_of(call: Any, *args: Any) -> MNSServerException:
    with pytest.raises(MNSServerException) as info:
        call(*args)
    return info.value


def raw_request(
    server: MNSServer,
    method: str,
    uri: str,
    body: bytes = b"",
    *,
    access_key: str = "test-key",
    header_changes: dict[str, str | None] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """Send a request signed by the SDK's own header builder, optionally altered."""
    client = MNSClient(server.endpoint, "test-id", access_key)
    req_inter = RequestInternal(method, uri)
    req_inter.data = body if body else ""
    client.build_header(types.SimpleNamespace(request_id=None), req_inter)
    headers: dict[str, str] = dict(req_inter.header)
    for name, value in (header_changes or {}).items():
        headers.pop(name, None)
        if value is not None:
            headers[name] = value
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request(method, uri, body=body or None, headers=headers)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def xml_fields(data: bytes) -> tuple[str, dict[str, str]]:
    root = ET.fromstring(data)
    return root.tag.rpartition("}")[2], {
        child.tag.rpartition("}")[2]: child.text or "" for child in root
    }


def now_ms() -> int:
    return int(time.time() * 1000)


# --------------------------------------------------------------------- queues


def test_create_queue_201_then_204_then_conflict(server: MNSServer) -> None:
    account = Account(server.endpoint, "test-id", "test-key")
    meta = QueueMeta()
    meta.set_visibilitytimeout(12)
    meta.set_polling_wait_seconds(0)
    url = account.get_queue("fresh").create(meta)
    assert url == f"{server.endpoint}/queues/fresh"
    # Same attributes again: 204, which the SDK accepts (it reads Location).
    assert account.get_queue("fresh").create(meta) == url
    other = QueueMeta()
    other.set_visibilitytimeout(13)
    assert error_of(account.get_queue("fresh").create, other).type == "QueueAlreadyExist"
    attributes = account.get_queue("fresh").get_attributes()
    assert attributes.visibility_timeout == 12
    assert attributes.queue_name == "fresh"


def test_create_queue_rejects_out_of_range_visibility(server: MNSServer) -> None:
    meta = QueueMeta()
    meta.set_visibilitytimeout(43201)
    queue = Account(server.endpoint, "test-id", "test-key").get_queue("bad")
    assert error_of(queue.create, meta).type == "InvalidArgument"


def test_unknown_queue_is_queue_not_exist(server: MNSServer) -> None:
    missing = Account(server.endpoint, "test-id", "test-key").get_queue("missing")
    assert error_of(missing.receive_message, 0).type == "QueueNotExist"
    assert error_of(missing.send_message, Message("x")).type == "QueueNotExist"
    assert error_of(missing.change_message_visibility, "1-00", 10).type == "QueueNotExist"
    assert error_of(missing.delete_message, "1-00").type == "QueueNotExist"


def test_delete_queue(server: MNSServer, queue: Any) -> None:
    queue.delete()
    assert error_of(queue.receive_message, 0).type == "QueueNotExist"


# ------------------------------------------------------------ send / receive


def test_send_and_receive_return_all_fields(server: MNSServer, queue: Any) -> None:
    sent = queue.send_message(Message("hello"))
    as_sent = base64.b64encode(b"hello").decode()
    # MD5 of the body as it travelled (base64 text), upper-case hex.
    assert sent.message_body_md5 == hashlib.md5(as_sent.encode()).hexdigest().upper()
    before = now_ms()
    received = queue.receive_message(0)
    assert received.message_body == b"hello"  # the SDK base64-decodes
    assert received.message_id == sent.message_id
    assert received.message_body_md5 == sent.message_body_md5
    assert received.dequeue_count == 1
    assert received.priority == 8
    assert before - 2000 <= received.enqueue_time <= now_ms()
    assert before - 2000 <= received.first_dequeue_time <= now_ms()
    assert abs(received.next_visible_time - (before + 30_000)) < 2000
    assert received.receipt_handle
    stats = server.queue_stats(QUEUE)
    assert (stats.visible, stats.in_flight, stats.delayed) == (0, 1, 0)
    assert stats.receive_counts == {sent.message_id: 1}


def test_body_is_stored_and_returned_exactly_as_sent(queue: Any) -> None:
    queue.set_encoding(False)
    body = "  héllo <&> ]]> 'quoted' \"double\"  "
    queue.send_message(Message(body))
    assert queue.receive_message(0).message_body == body


def test_empty_queue_receive_is_message_not_exist(queue: Any) -> None:
    assert error_of(queue.receive_message, 0).type == "MessageNotExist"
    assert error_of(queue.batch_receive_message, 16, 0).type == "MessageNotExist"


def test_batch_receive_of_sixteen(server: MNSServer, queue: Any) -> None:
    queue.batch_send_message([Message(f"m{i}") for i in range(16)])
    for i in range(16, 20):
        queue.send_message(Message(f"m{i}"))
    first = queue.batch_receive_message(16, 0)
    assert len(first) == 16
    assert [m.message_body for m in first] == [f"m{i}".encode() for i in range(16)]
    assert len({m.receipt_handle for m in first}) == 16
    second = queue.batch_receive_message(16, 0)
    assert [m.message_body for m in second] == [f"m{i}".encode() for i in range(16, 20)]
    assert all(m.dequeue_count == 1 for m in first + second)
    assert server.queue_stats(QUEUE).in_flight == 20


def test_batch_receive_limits(queue: Any) -> None:
    # The SDK only rejects negative sizes; the service enforces 1-16 and 0-30 s.
    assert error_of(queue.batch_receive_message, 17, 0).type == "InvalidArgument"
    assert error_of(queue.receive_message, 31).type == "InvalidArgument"


def test_priority_orders_delivery(queue: Any) -> None:
    queue.send_message(Message("low", priority=12))
    queue.send_message(Message("high", priority=1))
    assert queue.receive_message(0).message_body == b"high"
    assert queue.receive_message(0).message_body == b"low"


def test_re_receive_counts_and_keeps_first_dequeue_time(fake_clock: FakeClock, fqueue: Any) -> None:
    fqueue.send_message(Message("again"))
    first = fqueue.receive_message(0)
    assert first.first_dequeue_time == 1_700_000_000_000
    assert first.next_visible_time == 1_700_000_030_000
    fake_clock.advance(31)
    second = fqueue.receive_message(0)
    assert second.dequeue_count == 2
    assert second.first_dequeue_time == first.first_dequeue_time
    assert second.next_visible_time == 1_700_000_061_000
    assert second.receipt_handle != first.receipt_handle
    # The first receive's handle is dead now that the message was received again.
    assert error_of(fqueue.delete_message, first.receipt_handle).type == "ReceiptHandleError"
    fqueue.delete_message(second.receipt_handle)


# ---------------------------------------------------- change visibility / delete


def test_change_visibility_rotates_the_handle(queue: Any) -> None:
    queue.send_message(Message("work"))
    received = queue.receive_message(0)
    before = now_ms()
    changed = queue.change_message_visibility(received.receipt_handle, 60)
    assert changed.receipt_handle != received.receipt_handle
    # A str here (the SDK does not convert it), an int on received messages.
    assert isinstance(changed.next_visible_time, str)
    assert abs(int(changed.next_visible_time) - (before + 60_000)) < 2000
    old = received.receipt_handle
    stale = error_of(queue.change_message_visibility, old, 60)
    assert stale.type == "ReceiptHandleError"
    assert stale.req_id
    assert error_of(queue.delete_message, old).type == "ReceiptHandleError"
    queue.delete_message(changed.receipt_handle)


def test_delete_with_newest_handle_after_ten_extends(server: MNSServer, queue: Any) -> None:
    queue.send_message(Message("long job"))
    handle = queue.receive_message(0).receipt_handle
    handles = [handle]
    for _ in range(10):
        handle = queue.change_message_visibility(handle, 30).receipt_handle
        handles.append(handle)
    assert len(set(handles)) == 11
    for old in handles[:-1]:
        assert error_of(queue.delete_message, old).type == "ReceiptHandleError"
    queue.delete_message(handle)
    assert server.queue_stats(QUEUE).deleted_count == 1
    # Deleted: the newest handle now names a message that does not exist.
    assert error_of(queue.delete_message, handle).type == "MessageNotExist"
    assert error_of(queue.change_message_visibility, handle, 30).type == "MessageNotExist"


def test_never_issued_handle_is_receipt_handle_error(queue: Any) -> None:
    assert error_of(queue.delete_message, "1-not-a-handle").type == "ReceiptHandleError"


def test_change_visibility_range(queue: Any) -> None:
    queue.send_message(Message("x"))
    handle = queue.receive_message(0).receipt_handle
    # The SDK lets 0 through; the service wants 1-43200.
    assert error_of(queue.change_message_visibility, handle, 0).type == "InvalidArgument"
    # A rejected request leaves the handle valid.
    assert queue.change_message_visibility(handle, 43200).receipt_handle


def test_expired_but_newest_handle_still_works(fake_clock: FakeClock, fqueue: Any) -> None:
    """Documented choice: nobody re-received the message, so the handle is still newest."""
    fqueue.send_message(Message("late"))
    handle = fqueue.receive_message(0).receipt_handle
    fake_clock.advance(45)  # visible again, but not received again
    handle = fqueue.change_message_visibility(handle, 30).receipt_handle
    fake_clock.advance(45)
    fqueue.delete_message(handle)
    assert error_of(fqueue.receive_message, 0).type == "MessageNotExist"


def test_batch_delete_reports_only_the_stale_handle(server: MNSServer, queue: Any) -> None:
    for i in range(4):
        queue.send_message(Message(f"b{i}"))
    messages = queue.batch_receive_message(4, 0)
    stale = messages[2].receipt_handle
    queue.change_message_visibility(stale, 30)
    handles = [m.receipt_handle for m in messages]
    error = error_of(queue.batch_delete_message, handles)
    assert error.type == "ReceiptHandleError"
    assert error.req_id  # from the x-mns-request-id header: the body has none
    assert error.sub_errors == [
        {
            "ErrorCode": "ReceiptHandleError",
            "ErrorMessage": "The receipt handle you provided is not valid.",
            "ReceiptHandle": stale,
        }
    ]
    stats = server.queue_stats(QUEUE)
    assert stats.deleted_count == 3
    assert stats.in_flight == 1


def test_batch_delete_all_good_is_silent(server: MNSServer, queue: Any) -> None:
    queue.batch_send_message([Message(f"g{i}") for i in range(16)])
    messages = queue.batch_receive_message(16, 0)
    queue.batch_delete_message([m.receipt_handle for m in messages])
    assert server.queue_stats(QUEUE).deleted_count == 16


# ------------------------------------------------ raw handles (+ / = unencoded)


class Base64HandleServer(MNSServer):
    """Issues handles shaped like the real service's: base64 with + / =."""

    def _new_receipt_handle(self) -> str:
        return f"1-{uuid.uuid4().hex[:12]}+Ab/Cd{uuid.uuid4().hex[:6]}=="


def test_raw_plus_slash_equals_handles_are_parsed_verbatim() -> None:
    with Base64HandleServer() as srv:
        srv.create_queue(QUEUE)
        queue = Account(srv.endpoint, "test-id", "test-key").get_queue(QUEUE)
        queue.send_message(Message("sdk"))
        queue.send_message(Message("raw"))
        # Through the SDK, which puts the handle into the URL un-encoded.
        handle = queue.receive_message(0).receipt_handle
        assert "+" in handle and "/" in handle and handle.endswith("==")
        handle = queue.change_message_visibility(handle, 30).receipt_handle
        queue.delete_message(handle)

        # By hand: the raw request line carries "+/==" as typed.
        handle = queue.receive_message(0).receipt_handle
        uri = f"/queues/{QUEUE}/messages?ReceiptHandle={handle}&VisibilityTimeout=30"
        status, headers, body = raw_request(srv, "PUT", uri)
        assert status == 200, body
        assert "x-mns-request-id" in headers
        root, fields = xml_fields(body)
        assert root == "ChangeVisibility"
        new_handle = fields["ReceiptHandle"]
        assert int(fields["NextVisibleTime"]) > now_ms()
        # The old handle sent raw is stale, not mangled into an unknown one.
        status, _, body = raw_request(
            srv, "DELETE", f"/queues/{QUEUE}/messages?ReceiptHandle={handle}"
        )
        assert (status, xml_fields(body)[1]["Code"]) == (400, "ReceiptHandleError")
        # A client that does percent-encode the handle works as well.
        encoded = quote(new_handle, safe="")
        status, _, _ = raw_request(
            srv, "DELETE", f"/queues/{QUEUE}/messages?ReceiptHandle={encoded}"
        )
        assert status == 204
        assert srv.queue_stats(QUEUE).deleted_count == 2


# --------------------------------------------------------- request checking


def test_bad_signature_and_unknown_access_id(server: MNSServer) -> None:
    wrong_key = Account(server.endpoint, "test-id", "wrong-key").get_queue(QUEUE)
    error = error_of(wrong_key.receive_message, 0)
    assert error.type == "SignatureDoesNotMatch"
    wrong_id = Account(server.endpoint, "someone", "test-key").get_queue(QUEUE)
    assert error_of(wrong_id.send_message, Message("x")).type == "InvalidAccessKeyId"


def test_custom_credentials(fake_clock: FakeClock) -> None:
    with MNSServer(access_id="AKID", access_key="s3cret") as srv:
        srv.create_queue(QUEUE)
        queue = Account(srv.endpoint, "AKID", "s3cret").get_queue(QUEUE)
        queue.send_message(Message("ok"))
        default = Account(srv.endpoint, "test-id", "test-key").get_queue(QUEUE)
        assert error_of(default.receive_message, 0).type == "InvalidAccessKeyId"


def test_raw_requests_with_broken_headers_are_rejected(server: MNSServer) -> None:
    body = (
        b'<?xml version="1.0" encoding="utf-8"?><Message xmlns="http://mns.aliyuncs.com/doc/v1/">'
        b"<MessageBody>aGk=</MessageBody></Message>"
    )
    uri = f"/queues/{QUEUE}/messages"
    status, _, reply = raw_request(server, "POST", uri, body)
    assert status == 201 and xml_fields(reply)[0] == "Message"

    def code(**changes: str | None) -> tuple[int, str]:
        status, headers, reply = raw_request(server, "POST", uri, body, header_changes=changes)
        assert headers["x-mns-request-id"]
        root, fields = xml_fields(reply)
        assert root == "Error" and set(fields) == {"Code", "Message", "RequestId", "HostId"}
        return status, fields["Code"]

    wrong_md5 = base64.b64encode(hashlib.md5(b"other").hexdigest().encode()).decode()
    assert code(**{"content-md5": wrong_md5}) == (400, "InvalidDegist")
    # Binary digest instead of hex digest: a classic client bug.
    binary_md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
    assert code(**{"content-md5": binary_md5}) == (400, "InvalidDegist")
    assert code(Authorization=None) == (400, "MissingAuthorizationHeader")
    assert code(Authorization="Bearer token") == (400, "InvalidAuthorizationHeader")
    assert code(**{"x-mns-version": None}) == (400, "InvalidArgument")
    assert code(date=None) == (400, "MissingDateHeader")
    # A header the signature covers, changed after signing.
    assert code(**{"x-mns-version": "2015-06-06", "x-mns-extra": "1"}) == (
        403,
        "SignatureDoesNotMatch",
    )


# -------------------------------------------------------------------- timing


@pytest.mark.realtime
def test_unextended_message_comes_back_after_its_timeout() -> None:
    with MNSServer() as srv:
        srv.create_queue("short", visibility_timeout=1)
        queue = Account(srv.endpoint, "test-id", "test-key").get_queue("short")
        queue.send_message(Message("retry me"))
        start = time.monotonic()
        first = queue.receive_message(0)
        # Long poll: the server sleeps until the message's visibility runs out.
        again = queue.receive_message(3)
        elapsed = time.monotonic() - start
        assert 0.8 <= elapsed < 1.8
        assert again.message_id == first.message_id
        assert again.dequeue_count == 2


@pytest.mark.realtime
def test_long_poll_returns_when_a_message_arrives(server: MNSServer, queue: Any) -> None:
    sender = Account(server.endpoint, "test-id", "test-key").get_queue(QUEUE)
    timer = threading.Timer(0.3, lambda: sender.send_message(Message("wake up")))
    start = time.monotonic()
    timer.start()
    try:
        received = queue.receive_message(10)
    finally:
        timer.join()
    elapsed = time.monotonic() - start
    assert received.message_body == b"wake up"
    assert 0.25 <= elapsed < 2.0


@pytest.mark.realtime
def test_long_poll_ends_empty_after_wait(queue: Any) -> None:
    start = time.monotonic()
    assert error_of(queue.receive_message, 1).type == "MessageNotExist"
    assert 0.9 <= time.monotonic() - start < 2.0


def test_injected_clock_moves_visibility_without_sleeping(
    fake_clock: FakeClock, faked: MNSServer, fqueue: Any
) -> None:
    fqueue.send_message(Message("tick"))
    fqueue.receive_message(0)
    fake_clock.advance(29.9)
    assert error_of(fqueue.receive_message, 0).type == "MessageNotExist"
    assert faked.queue_stats(QUEUE).in_flight == 1
    fake_clock.advance(0.2)
    assert faked.queue_stats(QUEUE).visible == 1
    message = fqueue.receive_message(0)
    assert message.dequeue_count == 2
    assert message.next_visible_time == int((1_700_000_000 + 30.1 + 30) * 1000)


def test_injected_clock_releases_a_waiting_long_poll(
    fake_clock: FakeClock, faked: MNSServer, fqueue: Any
) -> None:
    fqueue.send_message(Message("held"))
    fqueue.receive_message(0)

    def later() -> None:
        fake_clock.advance(31)
        faked.wake_waiters()

    threading.Timer(0.2, later).start()
    start = time.monotonic()
    assert fqueue.receive_message(5).dequeue_count == 2
    assert time.monotonic() - start < 2.0


def test_delay_seconds(fake_clock: FakeClock, faked: MNSServer, fqueue: Any) -> None:
    fqueue.send_message(Message("later", delay_seconds=10))
    assert faked.queue_stats(QUEUE).delayed == 1
    assert error_of(fqueue.receive_message, 0).type == "MessageNotExist"
    fake_clock.advance(10)
    assert fqueue.receive_message(0).message_body == b"later"


# ---------------------------------------------------------------- test hooks


def test_fail_next(server: MNSServer, queue: Any) -> None:
    queue.send_message(Message("flaky"))
    server.fail_next("receive", "InternalError", 500, count=2)
    assert error_of(queue.receive_message, 0).type == "InternalError"
    assert error_of(queue.batch_receive_message, 4, 0).type == "InternalError"
    handle = queue.receive_message(0).receipt_handle
    server.fail_next("change_visibility", "ServiceUnavailable", 503)
    assert error_of(queue.change_message_visibility, handle, 30).type == "ServiceUnavailable"
    # The failed request changed nothing: the handle is still the newest.
    handle = queue.change_message_visibility(handle, 30).receipt_handle
    server.fail_next("batch_delete", "InternalError", 500)
    assert error_of(queue.batch_delete_message, [handle]).type == "InternalError"
    server.fail_next("delete", "QueueNotExist", 404)
    assert error_of(queue.delete_message, handle).type == "QueueNotExist"
    server.fail_next("send", "QpsLimitExceeded", 403)
    assert error_of(queue.send_message, Message("x")).type == "QpsLimitExceeded"
    queue.delete_message(handle)
    assert server.queue_stats(QUEUE).deleted_count == 1
    with pytest.raises(ValueError):
        server.fail_next("peek", "InternalError", 500)


def test_non_loopback_hosts_are_refused() -> None:
    for host in ("0.0.0.0", "192.168.1.10", "::", "example.com", ""):
        with pytest.raises(ValueError, match="loopback"):
            MNSServer(host=host)
    with MNSServer(host="localhost") as srv:
        assert srv.endpoint.startswith("http://127.0.0.1:")


def test_logs_never_contain_handles_or_the_key(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="leasekeeper.testing.mns_server")
    with MNSServer(access_key="very-secret-key") as srv:
        endpoint = srv.endpoint
        srv.create_queue(QUEUE)
        queue = Account(srv.endpoint, "test-id", "very-secret-key").get_queue(QUEUE)
        queue.send_message(Message("a"))
        queue.send_message(Message("b"))
        handles = [m.receipt_handle for m in queue.batch_receive_message(2, 0)]
        handles.append(queue.change_message_visibility(handles[0], 30).receipt_handle)
        queue.delete_message(handles[-1])
        error_of(queue.delete_message, handles[0])
        queue.batch_delete_message([handles[1]])
    text = caplog.text
    assert f"MNS test server listening on {endpoint} (loopback only)" in text
    assert "ReceiptHandle=<redacted>" in text
    assert "very-secret-key" not in text
    for handle in handles:
        assert handle not in text


def test_stop_ends_a_long_poll_promptly() -> None:
    srv = MNSServer().start()
    srv.create_queue(QUEUE)
    queue = Account(srv.endpoint, "test-id", "test-key").get_queue(QUEUE)
    outcome: list[BaseException] = []

    def poll() -> None:
        try:
            queue.receive_message(20)
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(0.2)
    start = time.monotonic()
    srv.stop()
    thread.join(5)
    assert not thread.is_alive()
    assert time.monotonic() - start < 3
    assert outcome  # a 503 or a closed connection, not a 20 s hang


def test_one_account_per_thread_is_safe(server: MNSServer) -> None:
    errors: list[BaseException] = []

    def work(n: int) -> None:
        queue = Account(server.endpoint, "test-id", "test-key").get_queue(QUEUE)
        try:
            for i in range(25):
                queue.send_message(Message(f"{n}-{i}"))
                message = queue.receive_message(1)
                queue.delete_message(message.receipt_handle)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    stats = server.queue_stats(QUEUE)
    assert stats.deleted_count == 100
    assert all(count == 1 for count in stats.receive_counts.values())


def test_many_clients_connecting_at_once_are_not_stalled(server: MNSServer) -> None:
    """A listen backlog of 5 (socketserver's default) made some of 40 simultaneous
    first connections wait 1-2 s for a SYN retransmit."""
    clients = 40
    queues = [
        Account(server.endpoint, "test-id", "test-key").get_queue(QUEUE) for _ in range(clients)
    ]
    start = threading.Barrier(clients)
    latencies: list[float] = []
    lock = threading.Lock()

    def first_request(queue: Any) -> None:
        start.wait(10)
        began = time.monotonic()
        with contextlib.suppress(MNSServerException):
            queue.receive_message(0)  # connects: each Account has its own connection
        with lock:
            latencies.append(time.monotonic() - began)

    threads = [threading.Thread(target=first_request, args=(q,)) for q in queues]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(latencies) == clients
    assert max(latencies) < 0.9, sorted(latencies)[-5:]


# ---------------------------------------------------------------------- CLI


def test_cli_serves_until_sigterm() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    command = [
        sys.executable,
        "-m",
        "leasekeeper.testing.mns_server",
        "--port",
        "0",
        "--queue",
        "cli",
        "--access-id",
        "cli-id",
        "--access-key",
        "cli-key",
    ]
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        endpoint = proc.stdout.readline().strip()
        assert endpoint.startswith("http://127.0.0.1:"), endpoint
        queue = Account(endpoint, "cli-id", "cli-key").get_queue("cli")
        queue.send_message(Message("from the CLI"))
        assert queue.receive_message(0).message_body == b"from the CLI"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 0, stderr
    assert "(loopback only)" in stderr
