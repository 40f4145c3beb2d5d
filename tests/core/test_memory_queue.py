"""MemoryQueue behaves like the real services: visibility, receipts, counters."""

from __future__ import annotations

import math
import threading
import time

import pytest

from leasekeeper import Handle, connect
from leasekeeper.backends.memory import MemoryQueue, MemoryRecord
from leasekeeper.testing import ManualClock


def test_visibility_timeout_hides_then_returns(clock: ManualClock, queue: MemoryQueue) -> None:
    queue.send("a")
    (first,) = queue.receive()
    assert first.receive_count == 1 and first.body == "a"
    assert queue.receive() == []
    assert (queue.visible_count(), queue.in_flight_count()) == (0, 1)
    clock.advance(30)
    (again,) = queue.receive()
    assert again.id == first.id and again.receive_count == 2
    assert again.receipt != first.receipt
    assert queue.receive_counts == {first.id: 2}


def test_receive_respects_max_messages_and_its_own_visibility(
    clock: ManualClock, queue: MemoryQueue
) -> None:
    queue.send_many([f"m{i}" for i in range(5)])
    got = queue.receive(max_messages=3, visibility_timeout=5)
    assert len(got) == 3
    clock.advance(5)
    assert queue.visible_count() == 5


def test_old_receipt_is_rejected_after_a_new_receive(
    clock: ManualClock, queue: MemoryQueue
) -> None:
    queue.send("a")
    (first,) = queue.receive()
    clock.advance(31)
    (second,) = queue.receive()
    assert queue.extend([first.handle], 10)[0].kind == "lost"
    assert queue.delete([first.handle])[0].kind == "lost"
    assert queue.delete([second.handle])[0].kind == "ok"
    assert queue.delete([second.handle])[0].detail == "MessageNotExist"


def test_rotation_makes_each_extend_issue_a_new_receipt(rotating: MemoryQueue) -> None:
    rotating.send("a")
    (message,) = rotating.receive()
    outcome = rotating.extend([message.handle], 10)[0]
    assert outcome.kind == "ok" and outcome.receipt and outcome.receipt != message.receipt
    stale = rotating.extend([message.handle], 10)[0]
    assert (stale.kind, stale.detail) == ("lost", "ReceiptHandleError")
    assert rotating.delete([Handle(message.id, outcome.receipt)])[0].kind == "ok"


def test_an_expired_receipt_still_works_if_nobody_received_again(
    clock: ManualClock, queue: MemoryQueue
) -> None:
    # As on SQS and Azure: the manager must track its own deadline (a "lapse").
    queue.send("a")
    (message,) = queue.receive()
    clock.advance(40)
    assert queue.extend([message.handle], 10)[0].kind == "ok"
    assert queue.visible_count() == 0


def test_release_with_and_without_delay(clock: ManualClock, queue: MemoryQueue) -> None:
    queue.send_many(["a", "b"])
    a, b = queue.receive(max_messages=2)
    queue.release([a.handle], 0)
    queue.release([b.handle], 3)
    assert queue.visible_count() == 1
    clock.advance(3)
    assert queue.visible_count() == 2


def test_batch_limits_are_enforced(queue: MemoryQueue) -> None:
    with pytest.raises(ValueError, match="max_batch"):
        queue.extend([Handle(str(i), "r") for i in range(11)], 10)
    # an empty batch is no call, as on every backend
    assert queue.delete([]) == queue.extend([], 5) == queue.release([], 0) == []
    assert queue.calls["delete"] == queue.calls["extend"] == queue.calls["release"] == 0


def test_per_entry_outcomes_in_order(queue: MemoryQueue) -> None:
    queue.send_many(["a", "b"])
    a, b = queue.receive(max_messages=2)
    outcomes = queue.delete([a.handle, Handle("nope", "x"), b.handle])
    assert [o.kind for o in outcomes] == ["ok", "lost", "ok"]
    assert queue.deleted_ids == [a.id, b.id]
    assert (queue.calls["delete"], queue.entries["delete"]) == (1, 3)


def test_adopt_round_trips_the_native_record(queue: MemoryQueue) -> None:
    queue.send("a")
    (message,) = queue.receive()
    assert isinstance(message.raw, MemoryRecord)
    adopted = queue.adopt(message.raw, visibility_timeout=12)
    assert (adopted.id, adopted.receipt, adopted.visibility_timeout) == (
        message.id,
        message.receipt,
        12.0,
    )
    with pytest.raises(TypeError, match="MemoryRecord"):
        queue.adopt({"id": "x"})
    assert message.receipt not in repr(message.raw)


def test_bad_bodies_and_arguments(queue: MemoryQueue) -> None:
    with pytest.raises(TypeError, match="body"):
        queue.send(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="visibility_timeout"):
        queue.receive(visibility_timeout=0)
    with pytest.raises(ValueError, match="max_messages"):
        queue.receive(max_messages=0)


@pytest.mark.realtime
def test_long_poll_returns_when_a_message_arrives() -> None:
    queue = MemoryQueue(5)
    threading.Timer(0.1, queue.send, args=("late",)).start()
    start = time.monotonic()
    got = queue.receive(wait_seconds=3)
    assert [m.body for m in got] == ["late"]
    assert time.monotonic() - start < 2


@pytest.mark.realtime
def test_long_poll_wakes_when_visibility_runs_out() -> None:
    queue = MemoryQueue(0.3)
    queue.send("a")
    queue.receive()
    start = time.monotonic()
    got = queue.receive(wait_seconds=3)
    assert len(got) == 1
    assert 0.2 < time.monotonic() - start < 2


def test_without_history_only_the_deleted_count_is_kept(clock: ManualClock) -> None:
    # history=False is for long runs: no per-message record outlives its message.
    queue = MemoryQueue(10.0, clock=clock, history=False)
    queue.send_many([f"job {i}" for i in range(5)])
    received = queue.receive(max_messages=5)
    assert [o.kind for o in queue.delete([m.handle for m in received[:3]])] == ["ok"] * 3
    assert [o.kind for o in queue.delete([received[0].handle])] == ["lost"]  # gone: once only
    assert (queue.deleted_count, len(queue)) == (3, 2)
    assert queue.deleted_ids == [] and queue.receive_counts == {}


def test_max_lease_age_caps_a_lease_and_visibility_cap_is_its_older_name(
    clock: ManualClock,
) -> None:
    assert MemoryQueue(30, clock=clock).max_lease_age == math.inf
    assert MemoryQueue(30, visibility_cap=100).max_lease_age == 100.0
    queue = MemoryQueue(30, clock=clock, max_lease_age=100)
    assert queue.visibility_cap == 100.0
    queue.send("job")
    [message] = queue.receive()
    # the manager stops min(60 s, 2 %) before the queue's own cap, as on SQS
    assert message.hard_deadline == message.received_at + 100 - 2
    clock.advance(60)
    assert queue.extend([message.handle], 30)[0].kind == "ok"  # to 90 s
    assert queue.extend([message.handle], 41)[0].kind == "capped"  # past 100 s
    with pytest.raises(ValueError, match="not both"):
        MemoryQueue(30, visibility_cap=10, max_lease_age=20)


def test_send_keeps_attributes_and_connect_names_one_queue_a_process(clock: ManualClock) -> None:
    queue = connect("memory://core-test-queue", clock=clock)
    assert isinstance(queue, MemoryQueue) and connect("memory://core-test-queue") is queue
    with pytest.raises(ValueError, match="exists already"):
        connect("memory://core-test-queue", visibility_timeout=5)
    sent = queue.send("job", {"lineage": "m-1/2"}, delay=5)
    assert queue.receive() == []
    clock.advance(5)
    [message] = queue.receive()
    assert (message.id, message.attributes) == (sent, {"lineage": "m-1/2"})
    assert queue.adopt(message.raw).attributes == {"lineage": "m-1/2"}
    assert queue.sibling("core-test-queue") is queue


def test_arguments_are_checked_as_every_backend_checks_them(queue: MemoryQueue) -> None:
    queue.send("a")
    [message] = queue.receive()
    for bad in (0, -1, math.nan, math.inf, "5", 43201):
        [outcome] = queue.extend([message.handle], bad)  # type: ignore[arg-type]
        assert outcome.kind == "fatal" and "not sent" in outcome.detail
    for bad in (-1, math.nan, None):
        [outcome] = queue.release([message.handle], bad)  # type: ignore[arg-type]
        assert outcome.kind == "fatal" and "not sent" in outcome.detail
    for wait in (-1, math.nan, "1"):
        with pytest.raises(ValueError, match="wait_seconds"):
            queue.receive(wait_seconds=wait)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="max_messages"):
        queue.receive(max_messages=1.5)  # type: ignore[arg-type]
    assert queue.calls["extend"] == queue.calls["release"] == 0  # nothing was sent
    assert queue.extend([message.handle], 30)[0].kind == "ok"


def test_a_fifo_queue_hands_each_group_out_in_order_and_locks_it_while_in_flight(
    clock: ManualClock,
) -> None:
    queue = MemoryQueue(30, clock=clock, fifo=True)
    for i in range(3):
        for group in ("a", "b"):
            queue.send(f"{group}{i}", group_id=group)
    first = queue.receive(4)
    # As many of a group as there are, in order, then the next group's.
    assert [(m.body, m.group) for m in first] == [
        ("a0", "a"),
        ("a1", "a"),
        ("a2", "a"),
        ("b0", "b"),
    ]
    assert "group='a'" in repr(first[0]) and queue.adopt(first[0].raw).group == "a"
    assert queue.receive(10) == []  # both groups have a message in flight
    queue.delete([m.handle for m in first[:3]])
    assert queue.receive(10) == []  # b0 still in flight: b is locked
    queue.release([first[3].handle], 5)
    assert queue.receive(10) == []  # released with a delay: still in flight until then
    clock.advance(5)
    assert [m.body for m in queue.receive(10)] == ["b0", "b1", "b2"]  # b0 first, again
    assert (queue.visible_count(), queue.in_flight_count(), len(queue)) == (0, 3, 3)


def test_a_fifo_queue_lets_a_group_go_when_its_visibility_runs_out(clock: ManualClock) -> None:
    queue = MemoryQueue(10, clock=clock, name="jobs.fifo")  # named *.fifo: a FIFO queue
    assert queue.fifo
    queue.send("1", group_id="g")
    queue.send("2", group_id="g")
    assert [m.body for m in queue.receive(1)] == ["1"]
    assert queue.receive(1) == []
    clock.advance(10)
    assert [m.body for m in queue.receive(2)] == ["1", "2"]  # 1 came back: first again


def test_a_fifo_long_poll_wakes_when_a_delete_lets_its_group_go() -> None:
    queue = MemoryQueue(30, fifo=True)
    queue.send("1", group_id="g")
    queue.send("2", group_id="g")
    [one] = queue.receive()
    threading.Timer(0.1, queue.delete, args=([one.handle],)).start()
    start = time.monotonic()
    got = queue.receive(wait_seconds=20)  # g is in flight: nothing until 1 is deleted
    assert [m.body for m in got] == ["2"]
    assert time.monotonic() - start < 10


def test_group_ids_on_a_standard_queue_name_a_tenant_and_order_nothing(clock: ManualClock) -> None:
    queue = MemoryQueue(30, clock=clock)
    queue.send("a1", group_id="tenant-a")
    queue.send("a2", group_id="tenant-a")
    queue.send("plain")
    got = queue.receive(10)
    assert [(m.body, m.group) for m in got] == [
        ("a1", "tenant-a"),
        ("a2", "tenant-a"),
        ("plain", None),
    ]
    assert queue.receive(10) == [] and not queue.fifo


def test_a_fifo_queue_checks_its_sends_as_sqs_does(clock: ManualClock) -> None:
    queue = MemoryQueue(30, clock=clock, fifo=True)
    with pytest.raises(ValueError, match="needs group_id"):
        queue.send("x")
    with pytest.raises(ValueError, match="no per-message delay"):
        queue.send("x", group_id="g", delay=5)
    with pytest.raises(ValueError, match="group_id must be"):
        queue.send("x", group_id="")
    assert len(queue) == 0
    assert connect("memory://core-test.fifo", clock=clock).fifo
