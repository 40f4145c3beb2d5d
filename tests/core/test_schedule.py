"""The scheduling state on its own: plain numbers in, due leases out. No threads, no clock."""

from __future__ import annotations

from typing import Any

import pytest

from leasekeeper.backends.base import Message
from leasekeeper.engine._schedule import Schedule
from leasekeeper.record import LeaseRecord


class FakeBackend:
    rotates_receipts = False
    max_visibility = 43200.0

    def __init__(self, max_batch: int) -> None:
        self.max_batch = max_batch


def record(backend: Any, message_id: str, visible_until: float = 100.0) -> LeaseRecord:
    message = Message(
        id=message_id,
        body="b",
        receipt=f"r-{message_id}",
        backend=backend,
        received_at=visible_until - 30.0,
        visibility_timeout=30.0,
    )
    return LeaseRecord(None, message, 0.0)


def add(schedule: Schedule, lane: Any, record: LeaseRecord, due: float) -> None:
    schedule.add(lane, record.message.id, record, due)


def ids(work: Any) -> list[list[str]]:
    return [[r.message.id for r in records] for _lane, records in work]


def test_collect_pops_only_what_is_due_in_due_order() -> None:
    schedule = Schedule(fill_window=0.0)
    backend = FakeBackend(max_batch=1)
    lane = schedule.add_lane(backend)
    for message_id, due in (("c", 30.0), ("a", 10.0), ("b", 20.0)):
        add(schedule, lane, record(backend, message_id), due)
    assert schedule.next_due() == 10.0
    due = schedule.collect(20.0)
    assert ids(due.work) == [["a", "b"]]
    assert due.worst_lag == 10.0  # "a" was due 10 s before
    assert all(r.gen == 0 for _, rs in due.work for r in rs)  # popped: unscheduled
    assert schedule.next_due() == 30.0
    assert schedule.collect(25.0).work == []


def test_a_partial_batch_is_topped_up_from_the_fill_window_and_no_further() -> None:
    schedule = Schedule(fill_window=5.0)
    backend = FakeBackend(max_batch=3)
    lane = schedule.add_lane(backend)
    for n, due in enumerate((10.0, 12.0, 14.0, 16.0, 30.0)):
        add(schedule, lane, record(backend, f"m{n}"), due)
    # Due at 10: m0. The batch has room for two more, due within 5 s: m1, m2 - and
    # it stops at a full batch, so m3 (also within the window) waits its turn.
    assert ids(schedule.collect(10.0).work) == [["m0", "m1", "m2"]]
    assert schedule.next_due() == 16.0


def test_a_batch_of_one_is_never_topped_up() -> None:
    schedule = Schedule(fill_window=5.0)
    backend = FakeBackend(max_batch=1)
    lane = schedule.add_lane(backend)
    add(schedule, lane, record(backend, "a"), 10.0)
    add(schedule, lane, record(backend, "b"), 11.0)
    assert ids(schedule.collect(10.0).work) == [["a"]]


def test_rescheduling_leaves_the_old_entry_stale_and_it_is_skipped() -> None:
    schedule = Schedule(fill_window=0.0)
    backend = FakeBackend(max_batch=10)
    lane = schedule.add_lane(backend)
    a = record(backend, "a")
    add(schedule, lane, a, 10.0)
    add(schedule, lane, record(backend, "b"), 50.0)
    schedule.push(lane, a, 40.0)  # later now: the entry at 10 is dead weight
    assert lane.stale == 1
    assert schedule.next_due() == 40.0  # the stale head was dropped on the way
    assert lane.stale == 0
    assert ids(schedule.collect(45.0).work) == [["a"]]


def test_removing_the_newest_lease_leaves_nothing_behind() -> None:
    # A short job: registered last, completed at once. Its entry is the heap's last
    # element and goes with it, so a stream of short jobs accumulates no stale entries.
    schedule = Schedule(fill_window=0.0)
    backend = FakeBackend(max_batch=10)
    lane = schedule.add_lane(backend)
    for n in range(100):
        add(schedule, lane, record(backend, f"old{n}"), 1000.0 + n)
    for n in range(1000):
        short = record(backend, f"short{n}")
        add(schedule, lane, short, 2000.0 + n)
        schedule.remove(lane, short)
    assert (lane.stale, len(lane.heap), schedule.count()) == (0, 100, 100)


def test_stale_entries_never_outnumber_live_ones_for_long() -> None:
    schedule = Schedule(fill_window=0.0)
    backend = FakeBackend(max_batch=10)
    lane = schedule.add_lane(backend)
    live = [record(backend, f"live{n}") for n in range(200)]
    for n, r in enumerate(live):
        add(schedule, lane, r, 5000.0 + n)  # due last: never the heap's last entry below
    for n in range(5000):
        r = record(backend, f"gone{n}")
        add(schedule, lane, r, float(n))
        add(schedule, lane, record(backend, f"keep{n}"), 10_000.0 + n)
        schedule.remove(lane, r)  # not the last entry any more: goes stale
        assert lane.stale <= max(65, len(lane.heap) // 2 + 1)
    assert schedule.count() == 5200


def test_removed_lease_is_forgotten_and_its_entry_skipped() -> None:
    schedule = Schedule(fill_window=0.0)
    backend = FakeBackend(max_batch=10)
    lane = schedule.add_lane(backend)
    a, b = record(backend, "a"), record(backend, "b")
    add(schedule, lane, a, 10.0)
    add(schedule, lane, b, 20.0)
    schedule.remove(lane, a)
    assert schedule.count() == 1
    assert list(schedule.records()) == [b]
    assert ids(schedule.collect(30.0).work) == [["b"]]


def test_a_watch_expires_at_the_deadline_unless_cleared() -> None:
    schedule = Schedule(fill_window=0.0)
    backend = FakeBackend(max_batch=10)
    lane = schedule.add_lane(backend)
    hung = record(backend, "hung", visible_until=50.0)
    answered = record(backend, "answered", visible_until=40.0)
    for r in (hung, answered):
        add(schedule, lane, r, 20.0)
        schedule.collect(30.0)  # popped for an extend
        schedule.watch(lane, r)
    assert schedule.next_due() == 40.0
    answered.watch = 0  # its call came back
    assert schedule.next_due() == 50.0  # a cleared watch wakes nobody
    assert schedule.collect(49.0).expired == []
    expired = schedule.collect(50.0).expired
    assert [r.message.id for _, r in expired] == ["hung"]
    assert schedule.next_due() is None


def test_lanes_are_per_backend_and_batched_by_their_own_limit() -> None:
    schedule = Schedule(fill_window=0.0)
    sqs_like, mns_like = FakeBackend(max_batch=10), FakeBackend(max_batch=1)
    lanes = {b: schedule.add_lane(b) for b in (sqs_like, mns_like)}
    for n in range(3):
        for backend, lane in lanes.items():
            add(schedule, lane, record(backend, f"{backend.max_batch}-{n}"), float(n))
    work = schedule.collect(5.0).work
    assert sorted(len(records) for _, records in work) == [3, 3]
    assert {lane.batch for lane, _ in work} == {1, 10}
    assert schedule.lane(sqs_like) is lanes[sqs_like]


@pytest.mark.parametrize("count", [1, 7, 64, 500])
def test_collect_returns_every_lease_exactly_once(count: int) -> None:
    schedule = Schedule(fill_window=2.0)
    backend = FakeBackend(max_batch=10)
    lane = schedule.add_lane(backend)
    for n in range(count):
        add(schedule, lane, record(backend, f"m{n}"), float(n % 13))
    seen: list[str] = []
    now = 0.0
    while schedule.next_due() is not None:
        now = max(now, schedule.next_due() or 0.0)
        seen += [r.message.id for _, rs in schedule.collect(now).work for r in rs]
    assert sorted(seen) == sorted(f"m{n}" for n in range(count))
