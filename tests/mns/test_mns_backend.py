"""MNSBackend through the real aliyun-mns-sdk against the local MNS server.

Nothing here fakes the SDK: every call goes over HTTP to
``leasekeeper.testing.mns_server.MNSServer``, so request encoding, response
parsing and error mapping are the SDK's own. Faults come from
``server.fail_next`` (5xx, QueueNotExist, authentication codes), from real
causes (a wrong key, a deleted queue, a stopped server) and from a stale handle.
"""

from __future__ import annotations

import base64
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mns.mns_exception import (
    MNSClientNetworkException,
    MNSClientParameterException,
    MNSServerException,
)
from mns.queue import Message as SDKMessage
from mns.queue import QueueMeta

from leasekeeper import (
    Backend,
    Handle,
    LeaseLost,
    LeaseManager,
    LeaseState,
    Outcome,
    Worker,
)
from leasekeeper.backends.mns import MNSBackend, MNSQueueError, classify_error
from leasekeeper.backends.shared import host_port
from leasekeeper.testing.mns_server import MNSServer
from tests.mns.conftest import ACCESS_ID, ACCESS_KEY, FakeClock, sdk_queue

HERE = Path(__file__).resolve().parent


def send(queue: Any, *bodies: str) -> list[str]:
    return [queue.send_message(SDKMessage(body)).message_id for body in bodies]


def send_bytes(queue: Any, body: bytes) -> str:
    """The SDK cannot send bytes (it calls body.encode()): send the base64 text."""
    queue.set_encoding(False)
    try:
        return str(queue.send_message(SDKMessage(base64.b64encode(body).decode())).message_id)
    finally:
        queue.set_encoding(True)


def receive_all(backend: MNSBackend, count: int, **kwargs: Any) -> list[Any]:
    messages: list[Any] = []
    deadline = time.monotonic() + 10
    while len(messages) < count and time.monotonic() < deadline:
        messages.extend(backend.receive(max_messages=16, **kwargs))
    assert len(messages) == count
    return messages


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


# ------------------------------------------------------------------ basics


def test_import_without_the_sdk_names_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['mns'] = None\n"
        "import leasekeeper\n"  # the core must import without the extra
        "try:\n"
        "    import leasekeeper.backends.mns\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    print('imported')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "pip install 'aliyun-mns-sdk>=1.3'" in out.stdout
    assert "aliyun-mns-sdk" in out.stdout


def test_attributes_and_repr(backend: MNSBackend, mns_server: MNSServer, queue_name: str) -> None:
    assert isinstance(backend, Backend)
    assert backend.max_batch == 1
    assert backend.max_visibility == 43200.0
    assert backend.rotates_receipts is True
    text = repr(backend)
    assert text == f"MNSBackend(host='127.0.0.1:{mns_server.port}', queue={queue_name!r})"
    assert ACCESS_KEY not in text and ACCESS_ID not in text


def test_takes_only_an_sdk_queue() -> None:
    with pytest.raises(TypeError, match=r"mns\.queue\.Queue"):
        MNSBackend(object())


def test_lease_manager_accepts_it(backend: MNSBackend) -> None:
    with LeaseManager(backend, visibility_timeout=60) as manager:
        assert manager.backend is backend


# ------------------------------------------------------------------ receive


def test_receive_fields(backend: MNSBackend, mns_queue: Any, mns_server: MNSServer) -> None:
    (sent,) = send(mns_queue, "hello")
    before = time.monotonic()
    (message,) = backend.receive(max_messages=1)
    after = time.monotonic()
    assert message.id == sent
    assert message.body == "hello"
    assert message.receive_count == 1
    assert isinstance(message.raw, SDKMessage)
    assert message.raw.message_id == sent
    assert message.receipt == message.raw.receipt_handle
    assert message.backend is backend
    assert before <= message.received_at <= after
    assert message.visibility_timeout == 30.0  # the queue's VisibilityTimeout
    assert message.hard_deadline is None
    # NextVisibleTime converted to local time: about received_at + 30, never used
    # unless it is earlier than the local estimate.
    assert message.deadline_hint is not None
    assert abs(message.deadline_hint - (message.received_at + 30)) < 1.0
    assert message.visible_until <= message.received_at + 30
    assert "hello" not in repr(message) and message.receipt not in repr(message)
    assert mns_server.queue_stats(backend.queue_name).in_flight == 1


def test_receive_batches_of_at_most_sixteen(backend: MNSBackend, mns_queue: Any) -> None:
    mns_queue.batch_send_message([SDKMessage(f"m{i}") for i in range(16)])
    mns_queue.batch_send_message([SDKMessage(f"n{i}") for i in range(4)])
    first = backend.receive(max_messages=50)
    assert len(first) == 16
    assert [m.body for m in first] == [f"m{i}" for i in range(16)]
    second = backend.receive(max_messages=50)
    assert [m.body for m in second] == [f"n{i}" for i in range(4)]


def test_receive_count_is_dequeue_count(
    faked_backend: MNSBackend, faked_queue: Any, fake_clock: FakeClock
) -> None:
    send(faked_queue, "again")
    assert faked_backend.receive()[0].receive_count == 1
    fake_clock.advance(31)
    assert faked_backend.receive()[0].receive_count == 2


def test_bodies_text_is_str_binary_is_bytes(backend: MNSBackend, mns_queue: Any) -> None:
    send(mns_queue, "plain text")
    send(mns_queue, "héllo wörld ✓")
    send_bytes(mns_queue, b"\xff\xfe\x00binary\x80")
    bodies = [m.body for m in receive_all(backend, 3)]
    assert bodies == ["plain text", "héllo wörld ✓", b"\xff\xfe\x00binary\x80"]
    assert isinstance(bodies[2], bytes)


def test_bodies_of_a_queue_without_base64(mns_server: MNSServer, queue_name: str) -> None:
    user_queue = sdk_queue(mns_server, queue_name)
    user_queue.set_encoding(False)  # the backend copies the user's encoding choice
    send(user_queue, "raw <text>")
    with MNSBackend(user_queue) as backend:
        (message,) = backend.receive()
    assert message.body == "raw <text>"


class Recorder:
    """Wraps each per-thread SDK Queue a backend makes, to see what it is asked."""

    def __init__(self, backend: MNSBackend, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], int, float]] = []
        self.users: dict[int, set[int]] = defaultdict(set)  # id(queue) -> thread idents
        self.queues: list[Any] = []
        self._lock = threading.Lock()
        self.clock = backend.clock
        original = backend._new_queue

        def new_queue() -> Any:
            queue = original()
            with self._lock:
                self.queues.append(queue)
            for name in (
                "batch_receive_message",
                "change_message_visibility",
                "delete_message",
                "batch_delete_message",
            ):
                self._wrap(queue, name)
            return queue

        monkeypatch.setattr(backend, "_new_queue", new_queue)

    def _wrap(self, queue: Any, name: str) -> None:
        inner = getattr(queue, name)

        def call(*args: Any) -> Any:
            with self._lock:
                self.calls.append((name, args, threading.get_ident(), self.clock.now()))
                self.users[id(queue)].add(threading.get_ident())
            return inner(*args)

        setattr(queue, name, call)

    def of(self, name: str) -> list[tuple[Any, ...]]:
        return [args for op, args, _, _ in self.calls if op == name]


def test_receive_arguments(
    backend: MNSBackend, mns_queue: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = Recorder(backend, monkeypatch)
    assert backend.receive(max_messages=50, wait_seconds=0.2) == []
    assert recorder.of("batch_receive_message") == [(16, 1)]  # 16 a call; ceil(0.2) = 1 s
    send(mns_queue, "x")
    (message,) = backend.receive(max_messages=3, wait_seconds=45)  # capped at 30 s
    assert recorder.of("batch_receive_message")[-1] == (3, 30)
    sent_at = recorder.calls[-1][3]
    assert message.received_at <= sent_at  # read just before the request


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_messages": 0}, ValueError),
        ({"max_messages": 1.5}, TypeError),
        ({"wait_seconds": -1}, ValueError),
        ({"wait_seconds": math.nan}, ValueError),
        ({"visibility_timeout": 0}, ValueError),
        ({"visibility_timeout": 43201}, ValueError),
    ],
)
def test_receive_rejects_bad_arguments(
    backend: MNSBackend, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        backend.receive(**kwargs)


def test_receive_with_the_queues_timeout_makes_no_extra_call(
    backend: MNSBackend, mns_queue: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = Recorder(backend, monkeypatch)
    send(mns_queue, "a")
    (message,) = backend.receive(visibility_timeout=29.5)  # rounds up to the queue's 30
    assert recorder.of("change_message_visibility") == []
    assert message.visibility_timeout == 29.5  # the local estimate keeps what was asked


def test_receive_with_another_timeout_changes_it_at_once(
    faked_backend: MNSBackend,
    faked_queue: Any,
    faked_server: MNSServer,
    fake_clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorder = Recorder(faked_backend, monkeypatch)
    send(faked_queue, "short", "shorter")
    messages = faked_backend.receive(max_messages=2, visibility_timeout=2)
    assert len(recorder.of("change_message_visibility")) == 2
    for message in messages:
        assert message.visibility_timeout == 2.0
        # raw and the receipt carry the handle the change issued (the old one is dead).
        assert message.receipt == message.raw.receipt_handle
        assert message.raw.next_visible_time == 1_700_000_002_000
        assert message.visible_until <= message.received_at + 2
    fake_clock.advance(1.9)
    assert faked_server.queue_stats("faked").visible == 0
    fake_clock.advance(0.2)
    assert faked_server.queue_stats("faked").visible == 2  # after 2 s, not the queue's 30
    # Longer than the queue's timeout works the same way.
    again = faked_backend.receive(max_messages=2, visibility_timeout=100)
    assert [m.visibility_timeout for m in again] == [100.0, 100.0]
    fake_clock.advance(99)
    assert faked_server.queue_stats("faked").visible == 0
    assert faked_backend.delete([m.handle for m in again]) == [Outcome("ok")] * 2


def test_receive_keeps_the_queues_timeout_when_the_change_fails(
    faked_backend: MNSBackend, faked_queue: Any, faked_server: MNSServer
) -> None:
    send(faked_queue, "a", "b")
    faked_server.fail_next("change_visibility", "InternalError", 500)
    first, second = faked_backend.receive(max_messages=2, visibility_timeout=60)
    assert first.visibility_timeout == 30.0  # still the queue's, with its original handle
    assert second.visibility_timeout == 60.0
    assert faked_backend.delete([first.handle, second.handle]) == [Outcome("ok")] * 2


def test_queue_visibility_timeout_is_read_once_and_cached(
    backend: MNSBackend, mns_queue: Any
) -> None:
    assert backend.queue_visibility_timeout() == 30.0
    meta = QueueMeta()
    meta.set_visibilitytimeout(40)
    mns_queue.set_attributes(meta)
    send(mns_queue, "x")
    assert backend.receive()[0].visibility_timeout == 30.0  # cached: no second read
    assert backend.refresh_queue_attributes() == 40.0


def test_queue_visibility_timeout_can_be_given(mns_server: MNSServer, queue_name: str) -> None:
    # For a RAM policy without mns:GetQueueAttributes.
    mns_server.fail_next("receive", "AccessDenied", 403)  # the receive itself fails...
    with MNSBackend(sdk_queue(mns_server, queue_name), queue_visibility_timeout=30) as backend:
        with pytest.raises(MNSQueueError) as info:
            backend.receive()
        assert info.value.operation == "receive"  # ...not a GetQueueAttributes before it
        assert backend.queue_visibility_timeout() == 30.0
    with pytest.raises(ValueError, match="queue_visibility_timeout"):
        MNSBackend(sdk_queue(mns_server, queue_name), queue_visibility_timeout=0)


# ------------------------------------------------------------------ deadline hints


class SkewedClock:
    """The real monotonic clock with a wall clock ``skew`` seconds ahead."""

    def __init__(self, skew: float) -> None:
        self.skew = skew

    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time() + self.skew

    def wait(self, condition: threading.Condition, timeout: float) -> bool:
        return condition.wait(timeout)


def test_next_visible_time_only_shortens_the_estimate(
    mns_server: MNSServer, mns_queue: Any, queue_name: str
) -> None:
    send(mns_queue, "x")
    with MNSBackend(sdk_queue(mns_server, queue_name), clock=SkewedClock(10.0)) as backend:
        (message,) = backend.receive()
    # The local wall clock is 10 s ahead: NextVisibleTime looks 10 s early, and wins.
    assert message.deadline_hint is not None
    assert abs(message.visible_until - (message.received_at + 20)) < 1.0


def test_next_visible_time_before_the_request_is_skew_and_ignored(
    mns_server: MNSServer,
    mns_queue: Any,
    queue_name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    send(mns_queue, "x", "y")
    caplog.set_level(logging.WARNING, logger="leasekeeper.backends.mns")
    with MNSBackend(sdk_queue(mns_server, queue_name), clock=SkewedClock(100.0)) as backend:
        messages = backend.receive(max_messages=2)
    for message in messages:
        assert message.deadline_hint is None
        assert message.visible_until == message.received_at + 30
    assert caplog.text.count("local clock is ahead") == 1  # warned once, not per message


# ------------------------------------------------------------------ adopt


def test_adopt_a_message_received_with_the_sdk(backend: MNSBackend, mns_queue: Any) -> None:
    (sent,) = send(mns_queue, "mine")
    raw = mns_queue.receive_message(0)
    before = time.monotonic()
    message = backend.adopt(raw)
    assert message.id == sent and message.body == "mine" and message.raw is raw
    assert message.visibility_timeout == 30.0
    # next_visible_time (less a 0.5 s skew allowance) shortens now + 30.
    assert message.deadline_hint is not None
    assert message.visible_until < before + 30
    assert message.visible_until > before + 28
    shorter = backend.adopt(raw, visibility_timeout=5)
    assert shorter.visible_until <= shorter.received_at + 5
    with LeaseManager(backend, visibility_timeout=30) as manager:
        lease = manager.register(backend.adopt(raw))
        assert backend.extend([lease.handle()], 30)[0].kind == "ok"  # what the scheduler does
        assert backend.extend([lease.handle()], 30)[0].kind == "lost"  # the rotated-out one


def test_adopt_refuses_what_cannot_be_leased(backend: MNSBackend) -> None:
    with pytest.raises(TypeError, match=r"mns\.queue\.Message"):
        backend.adopt("not a message")
    sent_only = SDKMessage("never received")
    sent_only.message_id = "ABC"
    with pytest.raises(ValueError, match="no receipt handle"):
        backend.adopt(sent_only)
    with pytest.raises(ValueError, match="visibility_timeout"):
        backend.adopt(sent_only, visibility_timeout=-1)


# ------------------------------------------------------------------ extend / release / delete


def test_extend_ten_times_then_delete_with_the_newest_handle(
    backend: MNSBackend, mns_queue: Any, mns_server: MNSServer
) -> None:
    send(mns_queue, "long job")
    (message,) = backend.receive()
    handle = message.handle
    seen = {handle.receipt}
    for _ in range(10):
        (outcome,) = backend.extend([handle], 30)
        assert outcome.kind == "ok"
        assert outcome.receipt is not None and outcome.receipt not in seen
        seen.add(outcome.receipt)
        handle = Handle(message.id, outcome.receipt)
    stale = message.handle
    # A stale handle: the service answers ReceiptHandleError, which is "lost".
    assert backend.extend([stale], 30) == [Outcome("lost", detail="ReceiptHandleError")]
    assert backend.delete([stale]) == [Outcome("lost", detail="ReceiptHandleError")]
    assert backend.delete([handle]) == [Outcome("ok")]
    assert mns_server.queue_stats(backend.queue_name).deleted_count == 1
    # Deleted: the newest handle now names a message that does not exist.
    assert backend.delete([handle]) == [Outcome("lost", detail="MessageNotExist")]
    assert backend.extend([handle], 30) == [Outcome("lost", detail="MessageNotExist")]


def test_extend_rounds_up_to_whole_seconds(
    faked_backend: MNSBackend, faked_queue: Any, faked_server: MNSServer, fake_clock: FakeClock
) -> None:
    send(faked_queue, "x")
    (message,) = faked_backend.receive()
    assert faked_backend.extend([message.handle], 2.2)[0].kind == "ok"
    fake_clock.advance(2.9)
    assert faked_server.queue_stats("faked").visible == 0  # 3 s, never less than asked
    fake_clock.advance(0.2)
    assert faked_server.queue_stats("faked").visible == 1


@pytest.mark.parametrize("timeout", [0.0, -1.0, 43200.5, math.inf, math.nan])
def test_extend_out_of_range_is_not_sent(backend: MNSBackend, timeout: float) -> None:
    (outcome,) = backend.extend([Handle("m", "1-00")], timeout)
    assert outcome.kind == "fatal"
    assert outcome.detail.startswith("InvalidArgument") and "not sent" in outcome.detail


def test_release_zero_means_one_second(
    faked_backend: MNSBackend, faked_queue: Any, faked_server: MNSServer, fake_clock: FakeClock
) -> None:
    send(faked_queue, "x")
    (message,) = faked_backend.receive()
    (outcome,) = faked_backend.release([message.handle], 0.0)
    assert outcome.kind == "ok" and outcome.receipt not in (None, message.receipt)
    fake_clock.advance(0.9)
    assert faked_server.queue_stats("faked").visible == 0
    fake_clock.advance(0.2)
    assert faked_server.queue_stats("faked").visible == 1


def test_release_delay_rounds_down(
    faked_backend: MNSBackend, faked_queue: Any, faked_server: MNSServer, fake_clock: FakeClock
) -> None:
    send(faked_queue, "x")
    (message,) = faked_backend.receive()
    assert faked_backend.release([message.handle], 5.7)[0].kind == "ok"
    fake_clock.advance(4.9)
    assert faked_server.queue_stats("faked").visible == 0
    fake_clock.advance(0.2)
    assert faked_server.queue_stats("faked").visible == 1  # 5 s: never held back longer
    assert faked_backend.release([message.handle], -1)[0].kind == "fatal"


def test_batch_delete_with_one_stale_handle(
    backend: MNSBackend, mns_queue: Any, mns_server: MNSServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = Recorder(backend, monkeypatch)
    send(mns_queue, "a", "b", "c", "d")
    messages = backend.receive(max_messages=4)
    assert len(messages) == 4
    assert backend.extend([messages[2].handle], 30)[0].kind == "ok"  # rotates c's handle
    outcomes = backend.delete([m.handle for m in messages])
    assert [o.kind for o in outcomes] == ["ok", "ok", "lost", "ok"]
    assert outcomes[2].detail == "ReceiptHandleError"
    assert len(recorder.of("batch_delete_message")) == 1  # one call for the four
    stats = mns_server.queue_stats(backend.queue_name)
    assert stats.deleted_count == 3 and stats.in_flight == 1


def test_delete_of_many_uses_batches_of_sixteen(
    backend: MNSBackend, mns_queue: Any, mns_server: MNSServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = Recorder(backend, monkeypatch)
    mns_queue.batch_send_message([SDKMessage(f"m{i}") for i in range(16)])
    mns_queue.batch_send_message([SDKMessage(f"n{i}") for i in range(4)])
    messages = receive_all(backend, 20)
    assert backend.delete([m.handle for m in messages]) == [Outcome("ok")] * 20
    assert [len(args[0]) for args in recorder.of("batch_delete_message")] == [16, 4]
    assert mns_server.queue_stats(backend.queue_name).deleted_count == 20


def test_batch_delete_whole_call_lost_is_resolved_one_by_one(
    backend: MNSBackend, mns_queue: Any, mns_server: MNSServer
) -> None:
    send(mns_queue, "a", "b")
    messages = backend.receive(max_messages=2)
    # An <Error> for the whole call names no entry: each is asked on its own.
    mns_server.fail_next("batch_delete", "MessageNotExist", 404)
    assert backend.delete([m.handle for m in messages]) == [Outcome("ok")] * 2


# ------------------------------------------------------------------ error mapping

EXTEND_ERRORS = [
    ("InternalError", 500, "retry"),
    ("ServiceUnavailable", 503, "retry"),
    ("QpsLimitExceeded", 403, "retry"),
    ("SomeFutureError", 500, "retry"),
    ("MessageNotExist", 404, "lost"),
    ("ReceiptHandleError", 400, "lost"),
    ("QueueNotExist", 404, "fatal"),
    ("AccessDenied", 403, "fatal"),
    ("InvalidAccessKeyId", 403, "fatal"),
    ("SignatureDoesNotMatch", 403, "fatal"),
    ("InvalidArgument", 400, "fatal"),
]


@pytest.mark.parametrize("case", EXTEND_ERRORS, ids=[c[0] for c in EXTEND_ERRORS])
def test_extend_and_release_error_mapping(
    backend: MNSBackend,
    mns_queue: Any,
    mns_server: MNSServer,
    case: tuple[str, int, str],
) -> None:
    code, status, kind = case
    send(mns_queue, "x")
    (message,) = backend.receive()
    mns_server.fail_next("change_visibility", code, status, count=2)
    for outcome in (
        backend.extend([message.handle], 30)[0],
        backend.release([message.handle], 0)[0],
    ):
        assert outcome.kind == kind
        assert outcome.receipt is None
        assert outcome.detail.split(":")[0] == code
    # The failed requests changed nothing: the handle still works.
    assert backend.delete([message.handle]) == [Outcome("ok")]


def test_invalid_argument_detail_says_it_is_a_bug(
    backend: MNSBackend, mns_queue: Any, mns_server: MNSServer
) -> None:
    send(mns_queue, "x")
    (message,) = backend.receive()
    mns_server.fail_next(
        "change_visibility",
        "InvalidArgument",
        400,
        message="The value of VisibilityTimeout should between 1 and 43200 seconds/bytes.",
    )
    (outcome,) = backend.extend([message.handle], 30)
    assert outcome.kind == "fatal"
    assert outcome.detail == (
        "InvalidArgument: the service rejected a request leasekeeper built "
        "(The value of VisibilityTimeout should between 1 and 43200 seconds/bytes.)"
    )


@pytest.mark.parametrize("case", EXTEND_ERRORS, ids=[c[0] for c in EXTEND_ERRORS])
def test_delete_error_mapping(
    backend: MNSBackend,
    mns_queue: Any,
    mns_server: MNSServer,
    case: tuple[str, int, str],
) -> None:
    code, status, kind = case
    send(mns_queue, "x", "y")
    messages = backend.receive(max_messages=2)
    mns_server.fail_next("delete", code, status)
    (outcome,) = backend.delete([messages[0].handle])
    assert (outcome.kind, outcome.detail.split(":")[0]) == (kind, code)
    if kind != "lost":  # a whole-call "lost" is re-asked entry by entry (tested above)
        mns_server.fail_next("batch_delete", code, status)
        outcomes = backend.delete([m.handle for m in messages])
        assert [(o.kind, o.detail.split(":")[0]) for o in outcomes] == [(kind, code)] * 2


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        ("InternalError", 500, "retry"),
        ("ServiceUnavailable", 503, "retry"),
        ("QueueNotExist", 404, "fatal"),
        ("AccessDenied", 403, "fatal"),
    ],
)
def test_receive_error_mapping(
    backend: MNSBackend, mns_server: MNSServer, code: str, status: int, kind: str
) -> None:
    backend.queue_visibility_timeout()  # read before the fault is armed
    mns_server.fail_next("receive", code, status)
    with pytest.raises(MNSQueueError) as info:
        backend.receive()
    error = info.value
    assert (error.operation, error.kind, error.detail.split(":")[0]) == ("receive", kind, code)
    assert error.__cause__ is None and error.__context__ is None  # the SDK's text stays out
    assert error.request_id  # for a support ticket


def test_wrong_access_key_is_fatal(mns_server: MNSServer, queue_name: str) -> None:
    wrong = "wrong-secret-key-42"
    good = MNSBackend(sdk_queue(mns_server, queue_name))
    sdk_queue(mns_server, queue_name).send_message(SDKMessage("x"))
    (message,) = good.receive()
    with MNSBackend(sdk_queue(mns_server, queue_name, key=wrong)) as backend:
        with pytest.raises(MNSQueueError) as info:
            backend.receive()  # the GetQueueAttributes before it is refused
        assert info.value.kind == "fatal"
        assert info.value.detail.startswith("SignatureDoesNotMatch")
        assert "mns:GetQueueAttributes" in info.value.detail
        assert wrong not in str(info.value)
        (outcome,) = backend.extend([message.handle], 30)
        assert outcome.kind == "fatal" and outcome.detail.startswith("SignatureDoesNotMatch")
        (outcome,) = backend.delete([message.handle])
        assert outcome.kind == "fatal"
    assert good.delete([message.handle]) == [Outcome("ok")]
    good.close()


def test_unknown_access_key_id_is_fatal(mns_server: MNSServer, queue_name: str) -> None:
    with MNSBackend(sdk_queue(mns_server, queue_name, key_id="nobody")) as backend:
        (outcome,) = backend.extend([Handle("m", "1-00")], 30)
    assert outcome.kind == "fatal" and outcome.detail.startswith("InvalidAccessKeyId")


def test_deleted_queue_is_fatal(backend: MNSBackend, mns_queue: Any, mns_server: MNSServer) -> None:
    send(mns_queue, "x")
    (message,) = backend.receive()
    mns_queue.delete()
    (outcome,) = backend.extend([message.handle], 30)
    assert outcome.kind == "fatal" and outcome.detail.startswith("QueueNotExist")
    assert backend.delete([message.handle])[0].kind == "fatal"
    with pytest.raises(MNSQueueError) as info:
        backend.receive()
    assert info.value.kind == "fatal" and info.value.detail.startswith("QueueNotExist")
    with pytest.raises(MNSQueueError) as info:
        backend.refresh_queue_attributes()
    assert info.value.kind == "fatal"


def test_stopped_server_is_a_network_error_to_retry() -> None:
    server = MNSServer().start()
    try:
        server.create_queue("gone")
        queue = sdk_queue(server, "gone")
        send(queue, "x")
        backend = MNSBackend(queue)
        (message,) = backend.receive()
        where = host_port(server.endpoint)
    finally:
        server.stop()
    # Unreachable: the detail names the server (host:port), as every backend's does.
    unreachable = f"could not reach {where} (NetWorkException)"
    assert backend.extend([message.handle], 30) == [Outcome("retry", detail=unreachable)]
    assert backend.release([message.handle], 0)[0].kind == "retry"
    assert backend.delete([message.handle]) == [Outcome("retry", detail=unreachable)]
    assert [o.kind for o in backend.delete([message.handle] * 2)] == ["retry", "retry"]
    with pytest.raises(MNSQueueError) as info:
        backend.receive()
    assert (info.value.kind, info.value.detail) == ("retry", unreachable)


def test_classify_error_of_other_exceptions() -> None:
    assert classify_error(MNSClientParameterException("VisibilityTimeoutInvalid", "bad"))[0] == (
        "fatal"
    )
    network = MNSClientNetworkException("RespDataDamaged", "<Message>1-secret-handle-0001</")
    assert classify_error(network) == ("retry", "RespDataDamaged")
    assert classify_error(ConnectionResetError()) == ("retry", "ConnectionResetError")
    assert classify_error(RuntimeError("boom")) == ("retry", "unexpected RuntimeError")
    odd = MNSServerException("<script>", "x", "req", "host")
    assert classify_error(odd) == ("retry", "UnknownError")


# ------------------------------------------------------------------ secrets


def test_receipts_and_the_key_never_leak(caplog: pytest.LogCaptureFixture) -> None:
    key = "Very-Secret-AccessKey-9f8e7d"
    caplog.set_level(logging.DEBUG)
    exceptions: list[BaseException] = []
    outcomes: list[Outcome] = []
    with MNSServer(access_key=key) as server:
        server.create_queue("secrets", visibility_timeout=30)
        queue = sdk_queue(server, "secrets", key=key)
        send(queue, "a", "b", "c")
        with MNSBackend(queue) as backend:
            messages = backend.receive(max_messages=3, visibility_timeout=60)
            handles = [m.receipt for m in messages] + [m.raw.receipt_handle for m in messages]
            first = messages[0].handle
            # The service quotes the handle in its message text: it must not get through.
            server.fail_next(
                "change_visibility",
                "InvalidArgument",
                400,
                message=f"ReceiptHandle {first.receipt} is bad; ReceiptHandle={first.receipt}",
            )
            outcomes += backend.extend([first], 30)
            server.fail_next("change_visibility", "InternalError", 500, message=first.receipt)
            outcomes += backend.extend([first], 30)
            outcomes += backend.extend([first], 30)
            handles += [o.receipt for o in outcomes if o.receipt]
            outcomes += backend.extend([first], 30)  # stale now
            outcomes += backend.delete([m.handle for m in messages])
            server.fail_next("receive", "InternalError", 500, message=first.receipt)
            try:
                backend.receive()
            except MNSQueueError as exc:
                exceptions.append(exc)
            texts = [repr(backend), *map(repr, messages), *map(repr, outcomes)]
            texts += [o.detail for o in outcomes]
            texts += [str(e) for e in exceptions] + [repr(e) for e in exceptions]
    assert exceptions and len(outcomes) == 7
    everything = "\n".join([caplog.text, *texts])
    assert "leasekeeper.backends.mns" in caplog.text  # the backend did log
    assert key not in everything
    for handle in handles:
        assert handle not in everything


# ------------------------------------------------------------------ threads


def test_the_users_queue_is_never_used(
    backend: MNSBackend, mns_queue: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    send(mns_queue, "x", "y")
    used: list[str] = []
    monkeypatch.setattr(mns_queue.mns_client.http, "send_request", lambda req: used.append(req.uri))
    messages = backend.receive(max_messages=2, visibility_timeout=10)
    backend.extend([messages[0].handle], 30)
    backend.release([messages[1].handle], 5)
    backend.delete([messages[0].handle])
    assert used == []


def test_per_thread_clients_and_a_new_one_after_fork(
    backend: MNSBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = backend._queue()
    assert backend._queue() is first
    other: list[Any] = []
    thread = threading.Thread(target=lambda: other.append(backend._queue()))
    thread.start()
    thread.join()
    assert other[0] is not first and other[0].mns_client is not first.mns_client
    monkeypatch.setattr(os, "getpid", lambda: -1)  # as in a forked child
    assert backend._queue() is not first


@pytest.mark.realtime
def test_two_hundred_leases_renewed_in_parallel_without_sharing_a_client(
    make_queue: Callable[..., tuple[str, Any]],
    mns_server: MNSServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name, user_queue = make_queue(4)
    for start in range(0, 200, 16):
        user_queue.batch_send_message(
            [SDKMessage(f"job {i}") for i in range(start, min(start + 16, 200))]
        )
    backend = MNSBackend(user_queue)
    recorder = Recorder(backend, monkeypatch)
    # extend_threshold=2: renew when 2 s of the 4 s are left, so a test box stalled
    # for a second by other load does not turn into lapses.
    manager = LeaseManager(
        backend,
        renewer="thread",  # the recorder watches this process's clients
        visibility_timeout=4,
        timer_interval=0.2,
        minimal_life=0.5,
        extend_threshold=2.0,
        max_concurrency=16,
    )
    try:
        leases = [manager.register(m) for m in receive_all(backend, 200)]
        wait_until(lambda: all(lease.extensions >= 2 for lease in leases), 15, "two extends each")
        stats = manager.stats()
        assert stats.lost == 0 and stats.extend_errors == 0, stats
        assert all(lease.state is LeaseState.ACTIVE for lease in leases)
        extends = [c for c in recorder.calls if c[0] == "change_message_visibility"]
        assert len(extends) >= 400
        # Every client the backend made was used by exactly one thread...
        assert recorder.users and all(len(t) == 1 for t in recorder.users.values())
        # ...and the extends really ran in parallel, on several threads.
        assert len({thread for _, _, thread, _ in extends}) > 4
        assert len(recorder.queues) == len(recorder.users)
    finally:
        manager.close(release=False)
    for lease in leases:
        lease.complete()
    queue_stats = mns_server.queue_stats(name)
    assert queue_stats.deleted_count == 200
    assert set(queue_stats.receive_counts.values()) == {1}
    backend.close()


@pytest.mark.realtime
def test_long_jobs_on_a_short_timeout_are_never_redelivered(
    make_queue: Callable[..., tuple[str, Any]], mns_server: MNSServer
) -> None:
    jobs, job_seconds = 8, 5.0
    name, user_queue = make_queue(2)
    send(user_queue, *[f"job {i}" for i in range(jobs)])
    backend = MNSBackend(user_queue)
    # The derived extend_threshold would be 0.7 s; 1.2 s leaves room for a test box
    # that other load stalls for a second.
    manager = LeaseManager(
        backend, visibility_timeout=2, timer_interval=0.2, minimal_life=0.5, extend_threshold=1.2
    )
    all_running = threading.Barrier(jobs + 1)

    def handle(message: Any) -> None:
        all_running.wait(timeout=10)
        time.sleep(job_seconds)

    stolen: list[str] = []
    polling = threading.Event()
    stop = threading.Event()

    def competing_consumer() -> None:  # its own Account: its own connection
        other = sdk_queue(mns_server, name)
        polling.set()
        while not stop.is_set():
            try:
                stolen.extend(m.message_id for m in other.batch_receive_message(16, 1))
            except MNSServerException as exc:
                assert exc.type == "MessageNotExist"

    worker = Worker(manager, handle, concurrency=jobs, batch_size=16, wait_seconds=1)
    worker.start()
    all_running.wait(timeout=10)  # every job is now being handled under a lease
    thief = threading.Thread(target=competing_consumer)
    thief.start()
    try:
        polling.wait(5)
        wait_until(lambda: worker.stats.completed == jobs, job_seconds + 10, "the jobs")
    finally:
        stop.set()
        thief.join(10)
        worker.stop(10)
        manager.close()
    assert stolen == []
    assert manager.stats().extended >= jobs * 2  # each job outlived its 2 s at least twice
    stats = mns_server.queue_stats(name)
    assert stats.deleted_count == jobs
    assert sorted(stats.receive_counts.values()) == [1] * jobs
    backend.close()


@pytest.mark.realtime
def test_a_killed_worker_s_message_is_back_within_the_visibility_timeout(
    make_queue: Callable[..., tuple[str, Any]], mns_server: MNSServer
) -> None:
    visibility, tick = 2.0, 0.2
    # The consumer below long-polls, so it sees the message as soon as it is visible;
    # the tolerance covers the poll's round trip and process scheduling.
    tolerance = 0.5
    name, user_queue = make_queue(2)
    (sent,) = send(user_queue, "doomed job")
    env = dict(os.environ)
    env.update(
        MNS_ENDPOINT=mns_server.endpoint,
        MNS_QUEUE=name,
        MNS_ACCESS_KEY_ID=ACCESS_ID,
        MNS_ACCESS_KEY_SECRET=ACCESS_KEY,
    )
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "kill_worker.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    consumer = sdk_queue(mns_server, name)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line == f"READY {sent}", line
        # While the worker lives its lease holds, well past the 2 s timeout.
        held_until = time.monotonic() + 2 * visibility
        while time.monotonic() < held_until:
            with pytest.raises(MNSServerException) as info:
                consumer.receive_message(1)
            assert info.value.type == "MessageNotExist"
        killed_at = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        received = None
        while received is None and time.monotonic() < killed_at + 10:
            try:
                received = consumer.receive_message(1)
            except MNSServerException as exc:
                assert exc.type == "MessageNotExist"
        back_after = time.monotonic() - killed_at
    finally:
        proc.kill()
        proc.wait(10)
        assert proc.stderr is not None
        stderr = proc.stderr.read()
        proc.stderr.close()
        if proc.stdout is not None:
            proc.stdout.close()
    assert received is not None, stderr
    assert received.message_id == sent
    assert received.dequeue_count == 2
    assert back_after <= visibility + tick + tolerance, back_after
    consumer.delete_message(received.receipt_handle)


# ------------------------------------------------------------------ the manager end to end


def test_manager_close_releases_for_one_second(
    make_queue: Callable[..., tuple[str, Any]], mns_server: MNSServer
) -> None:
    name, user_queue = make_queue(30)
    send(user_queue, "x")
    backend = MNSBackend(user_queue)
    manager = LeaseManager(backend, visibility_timeout=30)
    (message,) = backend.receive()
    lease = manager.register(message)
    manager.close()  # releases: delay 0, which MNS can only do as 1 s
    assert lease.state is LeaseState.RELEASED
    assert mns_server.queue_stats(name).visible == 0
    consumer = sdk_queue(mns_server, name)
    start = time.monotonic()
    again = consumer.receive_message(3)
    assert again.message_id == message.id
    assert time.monotonic() - start < 2.0


@pytest.fixture
def lease_scope_backend(
    make_queue: Callable[..., tuple[str, Any]],
) -> Iterator[tuple[MNSBackend, Any, str]]:
    name, user_queue = make_queue(30)
    with MNSBackend(user_queue) as backend:
        yield backend, user_queue, name


def test_with_lease_deletes_on_success(
    lease_scope_backend: tuple[MNSBackend, Any, str], mns_server: MNSServer
) -> None:
    backend, user_queue, name = lease_scope_backend
    send(user_queue, "ok")
    with LeaseManager(backend, visibility_timeout=30) as manager:
        (message,) = backend.receive()
        with manager.lease(message) as lease:
            pass
    assert lease.state is LeaseState.COMPLETED
    assert mns_server.queue_stats(name).deleted_count == 1


def test_with_lease_raises_lease_lost_for_a_rotated_out_receipt(
    lease_scope_backend: tuple[MNSBackend, Any, str], mns_server: MNSServer
) -> None:
    backend, user_queue, name = lease_scope_backend
    send(user_queue, "taken")
    with LeaseManager(backend, visibility_timeout=30) as manager:
        (message,) = backend.receive()
        with (
            pytest.raises(LeaseLost, match="ReceiptHandleError"),
            manager.lease(message) as lease,
        ):
            # Someone else rotates the handle (as a second consumer's receive would).
            assert backend.extend([message.handle], 30)[0].kind == "ok"
    assert lease.state is LeaseState.LOST
    assert mns_server.queue_stats(name).deleted_count == 0
