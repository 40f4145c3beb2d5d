"""What every backend shares (leasekeeper.backends.base): Message.with_backend, redact,
the argument and rounding helpers, ErrorTable, ThreadClients, CloudBackend's checks
and fallbacks, ReceiveError, and ForwardingBackend for wrappers."""

from __future__ import annotations

import logging
import math
import os
import re
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from leasekeeper import LeaseManager, ReceiveError
from leasekeeper.backends.base import (
    REDACTED,
    Backend,
    CloudBackend,
    ErrorTable,
    ForwardingBackend,
    Handle,
    Message,
    Outcome,
    ThreadClients,
    check_count,
    check_seconds,
    redact,
    whole_seconds,
)
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.errors import BackendError
from leasekeeper.testing import ManualClock


def test_with_backend_copies_the_message_but_names_the_wrapper(clock: ManualClock) -> None:
    inner = MemoryQueue(30.0, clock=clock)
    outer = MemoryQueue(30.0, clock=clock, name="wrapper")
    inner.send("payload")
    message = inner.receive()[0]
    copy = message.with_backend(outer)
    assert copy is not message and copy.backend is outer and message.backend is inner
    fields = ("id", "body", "receipt", "received_at", "visibility_timeout", "receive_count")
    fields += ("raw", "deadline_hint", "hard_deadline", "visible_until")
    assert [getattr(copy, f) for f in fields] == [getattr(message, f) for f in fields]
    assert message.receipt not in repr(copy)


def test_redact_blanks_secrets_as_written_and_url_quoted_then_patterns() -> None:
    secret = "AQEB/x+y=="
    text = f"bad handle {secret} in url ?ReceiptHandle=AQEB%2Fx%2By%3D%3D and key=abc123"
    out = redact(text, [secret, ""], [(re.compile(r"(key=)\w+"), r"\1" + REDACTED)])
    assert secret not in out and "AQEB%2F" not in out and "abc123" not in out
    assert out == f"bad handle {REDACTED} in url ?ReceiptHandle={REDACTED} and key={REDACTED}"
    assert redact("nothing secret here") == "nothing secret here"


# ---------------------------------------------------------------- seconds and arguments


@pytest.mark.parametrize(
    ("seconds", "up", "whole"),
    [
        (0.0, True, 0),
        (0.001, True, 1),
        (0.5, True, 1),
        (2.0, True, 2),
        (2.0000000001, True, 2),  # float noise is not a second more
        (2.2, True, 3),
        (0.9, False, 0),
        (1.7, False, 1),
        (1.9999999999, False, 2),  # nor a second less
        (-3.0, True, 0),
        (-3.0, False, 0),
    ],
)
def test_whole_seconds(seconds: float, up: bool, whole: int) -> None:
    assert whole_seconds(seconds, up=up) == whole


def test_check_count_and_seconds() -> None:
    assert check_count("max_messages", 5, 10) == 5
    assert check_count("max_messages", 50, 10) == 10  # "up to": more is not an error
    for bad in (True, 2.0, "3", None):
        with pytest.raises(TypeError, match="max_messages must be an int"):
            check_count("max_messages", bad, 10)
    with pytest.raises(ValueError, match="max_messages must be >= 1"):
        check_count("max_messages", 0, 10)
    assert check_seconds("wait_seconds", 3) == 3.0
    assert check_seconds("t", 5.0, low=1, high=5) == 5.0
    for bad in (-1, math.nan, math.inf, True, "1", None):
        with pytest.raises(ValueError, match="wait_seconds must be a number of seconds >= 0"):
            check_seconds("wait_seconds", bad)
    with pytest.raises(ValueError, match=r">= 1 and <= 5"):
        check_seconds("t", 5.5, low=1, high=5)


# ---------------------------------------------------------------- errors


def test_error_table_kinds_and_precedence() -> None:
    table = ErrorTable(lost={"Gone"}, retry={"Busy"}, fatal={"NoQueue"}, bug={"BadArg"})
    assert table.kind("Gone") == "lost"
    assert table.kind("Busy") == "retry"
    assert table.kind("NoQueue") == table.kind("BadArg") == "fatal"
    assert table.is_bug("BadArg") and not table.is_bug("NoQueue")
    assert table.kind("Unheard") is None and table.kind() is None
    # an error carrying several codes: the most definitive wins
    assert table.kind("Busy", "Gone") == "lost"
    assert table.kind("Unheard", "Busy", "NoQueue") == "fatal"
    with pytest.raises(ValueError, match="more than one group"):
        ErrorTable(lost={"X"}, retry={"X"})


def test_receive_error() -> None:
    fatal = ReceiveError("fatal", "QueueNotExist", service="MNS")
    assert isinstance(fatal, BackendError) and not fatal.retryable
    assert str(fatal) == "MNS receive failed (fatal): QueueNotExist"
    retry = ReceiveError("retry", "Throttling", operation="GetQueueAttributes")
    assert retry.retryable and retry.operation == "GetQueueAttributes"
    assert str(retry) == "GetQueueAttributes failed (retry): Throttling"
    with pytest.raises(ValueError, match="'retry' or 'fatal'"):
        ReceiveError("lost", "x")  # type: ignore[arg-type]


# ---------------------------------------------------------------- per-thread clients


class _Client:
    def __init__(self, number: int) -> None:
        self.number = number
        self.closed = False


def _clients(fail_close: bool = False) -> tuple[ThreadClients[_Client], list[_Client]]:
    made: list[_Client] = []

    def make() -> _Client:
        made.append(_Client(len(made)))
        return made[-1]

    def close(client: _Client) -> None:
        client.closed = True
        if fail_close:
            raise OSError("socket already gone")

    return ThreadClients(make, close, logging.getLogger("test")), made


def test_thread_clients_one_per_thread_and_new_after_close() -> None:
    clients, made = _clients()
    mine = clients.get()
    assert clients.get() is mine
    other: list[_Client] = []
    thread = threading.Thread(target=lambda: other.append(clients.get()))
    thread.start()
    thread.join()
    assert other[0] is not mine and len(made) == 2
    clients.close()
    assert mine.closed and other[0].closed
    fresh = clients.get()
    assert fresh is not mine and not fresh.closed


def test_thread_clients_new_after_fork_and_quiet_close_errors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clients, _ = _clients(fail_close=True)
    first = clients.get()
    monkeypatch.setattr(os, "getpid", lambda: -1)  # as in a forked child
    assert clients.get() is not first
    clients.close()  # a client that fails to close is logged, not raised


# ---------------------------------------------------------------- CloudBackend


class _Cloud(CloudBackend):
    """A CloudBackend whose "service" is a list of answers, to test the base alone."""

    service = "test service"
    max_visibility = 100.0
    rotates_receipts = False
    max_receive = 5
    max_wait_seconds = 20.0
    min_release = 1

    def __init__(self, errors: dict[str, BaseException] | None = None) -> None:
        self.clock = ManualClock()
        self.errors = errors or {}
        self.sent: list[tuple[str, list[str], Any]] = []

    def receive_messages(self, count: int, wait: float, visibility: float | None) -> list[Message]:
        self.sent.append(("receive", [], (count, wait, visibility)))
        if "receive" in self.errors:
            raise self.receive_error(self.errors["receive"])
        return []

    def _send(self, operation: str, handles: Sequence[Handle], arg: Any) -> list[Outcome]:
        self.sent.append((operation, [h.message_id for h in handles], arg))
        for handle in handles:
            if handle.message_id in self.errors:
                raise self.errors[handle.message_id]
        return [Outcome("ok")] * len(handles)

    def send_extend(self, handles: Sequence[Handle], seconds: int) -> list[Outcome]:
        return self.whole_call("extend", handles, lambda hs: self._send("extend", hs, seconds))

    def send_release(self, handles: Sequence[Handle], seconds: int) -> list[Outcome]:
        return self.per_entry("release", handles, lambda h: self._send("release", [h], seconds)[0])

    def send_delete(self, handles: Sequence[Handle]) -> list[Outcome]:
        return self.whole_call("delete", handles, lambda hs: self._send("delete", hs, None))

    def classify(self, exc: BaseException, receipts: Sequence[str] = ()) -> Outcome:
        kind = {LookupError: "lost", PermissionError: "fatal"}.get(type(exc), "retry")
        return Outcome(kind, detail=type(exc).__name__)  # type: ignore[arg-type]


def _handles(*ids: str) -> list[Handle]:
    return [Handle(i, f"receipt-of-{i}") for i in ids]


def test_cloud_receive_checks_then_hands_over() -> None:
    backend = _Cloud()
    assert isinstance(backend, Backend)
    backend.receive(max_messages=50, wait_seconds=60, visibility_timeout=0.2)
    # capped at max_receive and max_wait_seconds; wait left a float for the subclass
    assert backend.sent == [("receive", [], (5, 20.0, 0.2))]
    with pytest.raises(TypeError):
        backend.receive(max_messages=1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="wait_seconds"):
        backend.receive(wait_seconds=-0.1)
    with pytest.raises(ValueError, match="visibility_timeout"):
        backend.receive(visibility_timeout=0)  # below min_receive_visibility (1 s)
    with pytest.raises(ValueError, match="visibility_timeout"):
        backend.receive(visibility_timeout=101)
    assert len(backend.sent) == 1


@pytest.mark.parametrize(
    ("exc", "kind"), [(PermissionError(), "fatal"), (OSError(), "retry"), (LookupError(), "retry")]
)
def test_cloud_receive_error_says_whether_to_retry(exc: BaseException, kind: str) -> None:
    backend = _Cloud({"receive": exc})
    with pytest.raises(ReceiveError) as raised:
        backend.receive()
    assert raised.value.kind == kind and raised.value.retryable is (kind == "retry")
    assert str(raised.value).startswith("test service receive failed")


def test_cloud_extend_and_release_round_and_check() -> None:
    backend = _Cloud()
    h = _handles("a")
    assert backend.extend(h, 2.2) == [Outcome("ok")]
    assert backend.release(h, 3.7) == [Outcome("ok")]
    assert backend.release(h, 0.0) == [Outcome("ok")]  # at least min_release
    assert backend.release(h, 1e9) == [Outcome("ok")]  # at most max_visibility
    assert [s[2] for s in backend.sent] == [3, 3, 1, 100]
    for bad in (0.0, -1.0, 100.5, math.nan, math.inf):
        [outcome] = backend.extend(h, bad)
        assert outcome.kind == "fatal" and "not sent" in outcome.detail
    for bad in (-0.5, math.nan):
        [outcome] = backend.release(h, bad)
        assert outcome.kind == "fatal" and "not sent" in outcome.detail
    assert backend.extend([], 5) == backend.delete([]) == backend.release([], 0) == []
    assert len(backend.sent) == 4  # nothing else was sent


def test_whole_call_lost_on_a_batch_is_resolved_entry_by_entry() -> None:
    backend = _Cloud({"b": LookupError()})
    outcomes = backend.delete(_handles("a", "b", "c"))
    assert [o.kind for o in outcomes] == ["ok", "lost", "ok"]
    assert [s[1] for s in backend.sent] == [["a", "b", "c"], ["a"], ["b"], ["c"]]


def test_whole_call_retry_answers_every_entry_and_per_entry_isolates() -> None:
    backend = _Cloud({"b": OSError()})
    assert [o.kind for o in backend.extend(_handles("a", "b"), 5)] == ["retry", "retry"]
    assert len(backend.sent) == 1  # a transient failure is not re-sent entry by entry
    assert [o.kind for o in backend.release(_handles("a", "b", "c"), 1)] == ["ok", "retry", "ok"]


def test_failures_are_logged_without_receipts(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="leasekeeper.backends")
    backend = _Cloud({"a": PermissionError()})
    backend.delete(_handles("a"))
    [record] = [r for r in caplog.records if "delete of message 'a'" in r.getMessage()]
    assert record.levelno == logging.WARNING  # fatal: worth an operator's attention
    assert "receipt-of-a" not in record.getMessage()


def test_cloud_backend_is_a_context_manager() -> None:
    with _Cloud() as backend:
        assert isinstance(backend, _Cloud)


# ---------------------------------------------------------------- ForwardingBackend


class _Counting(ForwardingBackend):
    """A wrapper as a user would write one: counts calls, overrides one method."""

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner)
        self.deletes = 0
        self.wrapped: list[str] = []

    def wrap(self, message: Message) -> Message:
        self.wrapped.append(message.id)
        return super().wrap(message)

    def delete(self, handles: Sequence[Handle]) -> list[Outcome]:
        self.deletes += 1
        return super().delete(handles)


def test_forwarding_backend_copies_what_the_inner_backend_has(clock: ManualClock) -> None:
    memory = MemoryQueue(30.0, clock=clock, max_batch=3, rotate_receipts=True)
    wrapper = ForwardingBackend(memory)
    assert (wrapper.max_batch, wrapper.max_visibility, wrapper.rotates_receipts) == (
        3,
        43200.0,
        True,
    )
    # MemoryQueue sets no receive limits: neither does its wrapper
    assert not hasattr(wrapper, "max_receive") and not hasattr(wrapper, "max_wait_seconds")
    assert wrapper.clock is clock
    over_cloud = ForwardingBackend(_Cloud())
    assert (over_cloud.max_receive, over_cloud.max_wait_seconds) == (5, 20.0)
    twice = ForwardingBackend(over_cloud)  # wrappers stack
    assert twice.max_receive == 5 and repr(twice).startswith("ForwardingBackend(ForwardingBackend(")
    with pytest.raises(TypeError, match="wraps a leasekeeper backend"):
        ForwardingBackend(object())  # type: ignore[arg-type]


def test_forwarding_backend_re_points_messages_and_forwards_calls(clock: ManualClock) -> None:
    memory = MemoryQueue(30.0, clock=clock)
    wrapper = _Counting(memory)
    memory.send("a")
    memory.send("b")
    first, second = wrapper.receive(max_messages=2)
    assert first.backend is wrapper and second.backend is wrapper
    adopted = wrapper.adopt(first.raw)
    assert adopted.backend is wrapper and wrapper.wrapped == [first.id, second.id, first.id]
    assert wrapper.extend([first.handle], 60) == [Outcome("ok")]
    assert wrapper.forward("release", [second.handle], 0.0) == [Outcome("ok")]
    with LeaseManager(wrapper, clock=clock) as manager:
        manager.register(first).complete()
    assert wrapper.deletes == 1 and memory.deleted_ids == [first.id]
    with pytest.raises(ValueError, match="unknown operation"):
        wrapper.forward("peek", [], 0.0)  # type: ignore[arg-type]


def test_forwarding_backend_lets_receive_errors_through() -> None:
    wrapper = ForwardingBackend(_Cloud({"receive": PermissionError()}))
    with pytest.raises(ReceiveError, match="fatal"):
        wrapper.receive()
