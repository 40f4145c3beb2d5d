"""MemoryQueue behaves like the real services: visibility, receipts, counters."""

from __future__ import annotations

import threading
import time

import pytest

from leasekeeper import Handle
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
