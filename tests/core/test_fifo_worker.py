"""Worker and AsyncWorker on a FIFO queue (MemoryQueue(fifo=True), a ManualClock):
each message group in order, one message of a group at a time, groups side by side;
a failure sends the group's later messages back with it; standard queues unchanged."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from leasekeeper import Handle, Message, Outcome, Rollover, Worker
from leasekeeper.aio import AsyncWorker
from leasekeeper.backends.forwarding import ForwardingBackend
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.testing import FaultyBackend, ManualClock
from tests.core.test_worker import MANUAL, drive, run_in_thread

WAIT = 30.0  # real seconds a handler waits for what the test sets up, at most


def fill(queue: MemoryQueue, groups: Sequence[str], each: int) -> dict[str, str]:
    """``each`` messages a group, sent interleaved: "a:0", "b:0", "a:1", ...; their ids
    by body."""
    return {
        f"{group}:{index}": queue.send(f"{group}:{index}", group_id=group)
        for index in range(each)
        for group in groups
    }


class Journal:
    """What handlers saw: each group's messages in the order they started, the most
    groups and the most messages of one group handled at once, and the tries."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.order: dict[str, list[int]] = {}
        self.done: dict[str, list[int]] = {}
        self.active: Counter[str] = Counter()
        self.most_of_a_group = 0
        self.most_groups = 0
        self.tries: Counter[str] = Counter()

    def begin(self, message: Message) -> tuple[str, int]:
        group, index = str(message.body).split(":")
        with self.lock:
            self.order.setdefault(group, []).append(int(index))
            self.active[group] += 1
            self.most_of_a_group = max(self.most_of_a_group, self.active[group])
            self.most_groups = max(self.most_groups, sum(1 for n in self.active.values() if n))
            self.tries[str(message.body)] += 1
            return group, int(index)

    def end(self, message: Message, ok: bool = True) -> None:
        group, index = str(message.body).split(":")
        with self.lock:
            self.active[group] -= 1
            if ok:
                self.done.setdefault(group, []).append(int(index))


class Spy(ForwardingBackend):
    """Every extend and release, by receipt: so a test sees what was renewed after it
    was released."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.log: list[tuple[str, str, tuple[str, ...]]] = []  # (op, id, receipts)
        self.lock = threading.Lock()

    def extend(self, handles: Sequence[Handle], timeout: float) -> list[Outcome]:
        with self.lock:
            self.log += [("extend", h.message_id, (h.receipt,)) for h in handles]
        return super().extend(handles, timeout)

    def release(self, handles: Sequence[Handle], delay: float) -> list[Outcome]:
        with self.lock:
            self.log.append(
                (
                    "release",
                    ",".join(h.message_id for h in handles),
                    tuple(h.receipt for h in handles),
                )
            )
        return super().release(handles, delay)


def run_worker(clock: ManualClock, worker: Any, until_idle: float = 5, step: float = 1.0) -> Any:
    thread, out = run_in_thread(worker.run, until_idle=until_idle)
    drive(clock, thread, step)
    (stats,) = out
    assert not isinstance(stats, BaseException), stats
    return stats


def test_each_group_in_order_one_at_a_time_groups_side_by_side(clock: ManualClock) -> None:
    queue = MemoryQueue(30.0, clock=clock, fifo=True)
    fill(queue, "abc", 6)
    journal = Journal()
    together = threading.Barrier(3)  # each group's first message waits for the others'

    def handle(message: Message) -> None:
        _, index = journal.begin(message)
        if index == 0:
            together.wait(WAIT)  # broken (and so failed) unless all three run at once
        journal.end(message)

    worker = Worker(queue, handle, concurrency=8, wait_seconds=1, clock=clock, **MANUAL)
    stats = run_worker(clock, worker)
    assert journal.order == {group: list(range(6)) for group in "abc"}
    assert journal.most_of_a_group == 1 and journal.most_groups == 3
    assert (stats.completed, stats.failed, stats.held_back, stats.groups_waiting) == (18, 0, 0, 0)
    assert len(queue) == 0


def test_a_failure_sends_the_rest_of_its_group_back_with_it_in_one_call(clock: ManualClock) -> None:
    queue = MemoryQueue(30.0, clock=clock, fifo=True)
    fill(queue, "ab", 6)
    spy = Spy(queue)
    journal = Journal()
    started_after_failure: list[str] = []

    def handle(message: Message) -> None:
        group, index = journal.begin(message)
        if group == "a" and journal.tries["a:2"] == 1 and index > 2:
            started_after_failure.append(str(message.body))
        if message.body == "a:2" and journal.tries["a:2"] == 1:
            journal.end(message, ok=False)
            raise ValueError("the first try of a:2 fails")
        journal.end(message)

    worker = Worker(
        spy, handle, concurrency=4, wait_seconds=1, release_delay=10, clock=clock, **MANUAL
    )
    stats = run_worker(clock, worker, until_idle=30)  # a:2 is back within 12 s
    # Nothing later of a started before a:2's retry; b went on regardless.
    assert started_after_failure == []
    assert journal.done == {"a": list(range(6)), "b": list(range(6))}
    assert journal.order["a"] == [0, 1, 2, 2, 3, 4, 5]
    assert journal.tries["a:2"] == 2 and journal.most_of_a_group == 1
    # a:2 and the later messages of a the worker held went back in one release call.
    releases = [ids for op, ids, _ in spy.log if op == "release"]
    assert len(releases) == 1 and len(releases[0].split(",")) > 1
    assert stats.failed == 1 and stats.held_back == len(releases[0].split(",")) - 1
    assert stats.completed == 12 and len(queue) == 0
    # What went back was never renewed again with the receipt it had.
    released = {receipt for op, _, receipts in spy.log if op == "release" for receipt in receipts}
    index = next(i for i, entry in enumerate(spy.log) if entry[0] == "release")
    assert not [e for e in spy.log[index:] if e[0] == "extend" and e[2][0] in released]


def test_waiting_messages_stay_leased_and_renewed(clock: ManualClock) -> None:
    queue = MemoryQueue(30.0, clock=clock, fifo=True)
    fill(queue, "g", 3)
    first_runs = threading.Event()
    may_finish = threading.Event()
    journal = Journal()

    def handle(message: Message) -> None:
        journal.begin(message)
        if message.body == "g:0":
            first_runs.set()
            assert may_finish.wait(WAIT)
        journal.end(message)

    worker = Worker(queue, handle, concurrency=4, wait_seconds=1, clock=clock, **MANUAL)
    thread, out = run_in_thread(worker.run, until_idle=5)
    assert first_runs.wait(WAIT)
    assert worker.stats.groups_waiting == 1  # g waits on its first message
    for _ in range(10):  # 100 s: three visibility timeouts of g:0's job
        assert clock.wait_for_sleepers(1, timeout=WAIT)
        clock.advance(10)
    assert queue.visible_count() == 0 and queue.in_flight_count() == 3
    may_finish.set()
    drive(clock, thread)
    assert journal.done == {"g": [0, 1, 2]} and set(journal.tries.values()) == {1}
    assert set(queue.receive_counts.values()) == {1}  # none of them came back meanwhile
    assert out[0].groups_waiting == 0 and out[0].lost == 0


def test_a_lease_lost_while_waiting_sends_its_group_back_from_it(clock: ManualClock) -> None:
    queue = MemoryQueue(30.0, clock=clock, fifo=True)
    ids = fill(queue, "g", 4)
    faulty = FaultyBackend(queue)
    first_runs = threading.Event()
    may_finish = threading.Event()
    journal = Journal()

    def handle(message: Message) -> None:
        journal.begin(message)
        if message.body == "g:0" and journal.tries["g:0"] == 1:
            first_runs.set()
            assert may_finish.wait(WAIT)
        journal.end(message)

    worker = Worker(faulty, handle, concurrency=4, wait_seconds=1, clock=clock, **MANUAL)
    thread, _ = run_in_thread(worker.run, until_idle=5)
    assert first_runs.wait(WAIT)
    faulty.script("extend", "lost", message_id=ids["g:1"])  # g:1 waits: its renewal fails
    for _ in range(4):
        assert clock.wait_for_sleepers(1, timeout=WAIT)
        clock.advance(10)
    may_finish.set()
    drive(clock, thread)
    # g:1 was lost while it waited: g:2 and g:3 went back with nothing of g started
    # after g:0; the queue then handed g out again from g:1, and each ran in order.
    assert journal.order["g"] == [0, 1, 2, 3] and journal.done["g"] == [0, 1, 2, 3]
    assert worker.stats.lost == 1 and worker.stats.held_back == 2
    assert len(queue) == 0


def test_a_poison_message_moved_to_the_dead_letter_queue_lets_its_group_go_on(
    clock: ManualClock,
) -> None:
    queue = MemoryQueue(30.0, clock=clock, fifo=True)
    dead = MemoryQueue(30.0, clock=clock, name="dead.fifo")
    fill(queue, "g", 3)
    journal = Journal()

    def handle(message: Message) -> None:
        journal.begin(message)
        journal.end(message, ok=message.body != "g:1")
        if message.body == "g:1":
            raise ValueError("poison")

    worker = Worker(
        queue,
        handle,
        wait_seconds=1,
        max_receives=1,
        dead_letter=dead,
        clock=clock,
        **MANUAL,
    )
    stats = run_worker(clock, worker)
    assert journal.order["g"] == [0, 1, 2] and stats.dead_lettered == 1
    assert stats.held_back == 0 and len(queue) == 0
    [copy] = dead.receive(10)
    assert (copy.body, copy.group) == ("g:1", "g")  # the copy keeps its group


def test_a_rollover_sends_the_rest_of_its_group_back(clock: ManualClock) -> None:
    queue = MemoryQueue(30.0, clock=clock, fifo=True)
    fill(queue, "g", 3)
    journal = Journal()

    def handle(message: Message) -> None:
        journal.begin(message)
        journal.end(message)
        if message.body == "g:0" and journal.tries["g:0"] == 1:
            raise Rollover("hand it on")

    worker = Worker(queue, handle, concurrency=4, wait_seconds=1, clock=clock, **MANUAL)
    stats = run_worker(clock, worker)
    assert stats.rolled_over == 1 and stats.held_back == 2
    # g:1 and g:2 went back unhandled; the continuation (sent in g) comes after them.
    assert journal.order["g"] == [0, 1, 2, 0] and len(queue) == 0


def test_a_failed_delete_sends_the_rest_of_its_group_back(clock: ManualClock) -> None:
    queue = MemoryQueue(30.0, clock=clock, fifo=True)
    fill(queue, "g", 3)
    faulty = FaultyBackend(queue)
    faulty.script("delete", "lost")  # the first delete (g:0's) is refused
    journal = Journal()

    def handle(message: Message) -> None:
        journal.begin(message)
        journal.end(message)

    worker = Worker(faulty, handle, concurrency=4, wait_seconds=1, clock=clock, **MANUAL)
    stats = run_worker(clock, worker, until_idle=60, step=5)
    # g:0 was done but not deleted: nothing after it ran until it came back and was
    # deleted, so the group's deletes happened in order.
    assert journal.order["g"] == [0, 0, 1, 2] and queue.deleted_ids == sorted(queue.deleted_ids)
    assert stats.lost == 1 and stats.held_back == 2 and len(queue) == 0


def test_a_multi_queue_worker_keeps_each_queues_groups_apart(clock: ManualClock) -> None:
    one = MemoryQueue(30.0, clock=clock, name="one.fifo")
    two = MemoryQueue(30.0, clock=clock, name="two.fifo")
    for queue in (one, two):
        fill(queue, "g", 3)  # the same group id on both queues: two groups
    together = threading.Barrier(2)
    journal: dict[str, list[str]] = {"one.fifo": [], "two.fifo": []}

    def handle(message: Message) -> None:
        name = message.backend.name  # type: ignore[attr-defined]
        if message.body == "g:0":
            together.wait(WAIT)  # the two g's run side by side
        journal[name].append(str(message.body))

    worker = Worker([one, two], handle, concurrency=4, wait_seconds=1, clock=clock, **MANUAL)
    stats = run_worker(clock, worker)
    assert journal == {name: ["g:0", "g:1", "g:2"] for name in journal}
    assert stats.per_queue["one.fifo"].completed == stats.per_queue["two.fifo"].completed == 3


def test_a_standard_queue_runs_one_groups_messages_side_by_side(clock: ManualClock) -> None:
    queue = MemoryQueue(30.0, clock=clock)  # a "fair" queue: the group names a tenant
    for index in range(3):
        queue.send(f"tenant:{index}", group_id="tenant")
    together = threading.Barrier(3)
    journal = Journal()

    def handle(message: Message) -> None:
        journal.begin(message)
        together.wait(WAIT)  # all three at once, or broken
        journal.end(message)

    worker = Worker(queue, handle, concurrency=3, wait_seconds=1, clock=clock, **MANUAL)
    stats = run_worker(clock, worker)
    assert journal.most_of_a_group == 3 and stats.completed == 3


def test_a_one_group_backlog_neither_stalls_nor_floods_the_intake(clock: ManualClock) -> None:
    """On a backend that says it is ordered but does not hold a group back while it is
    in flight, the worker still receives no more than its allowance ahead."""
    queue = MemoryQueue(30.0, clock=clock)  # hands the group out without locking it
    ordered = ForwardingBackend(queue)
    ordered.fifo = True
    for index in range(60):
        queue.send(f"g:{index}", group_id="g")
    held: list[int] = []
    journal = Journal()

    def handle(message: Message) -> None:
        journal.begin(message)
        held.append(queue.in_flight_count())
        journal.end(message)

    worker = Worker(ordered, handle, concurrency=2, batch_size=5, clock=clock, **MANUAL)
    stats = run_worker(clock, worker)
    assert journal.order["g"] == list(range(60)) and stats.completed == 60
    # Its allowance (concurrency x batch_size = 10), its handlers and one batch more.
    assert max(held) <= 10 + 2 + 5


def test_a_stop_releases_the_messages_waiting_behind_their_group(clock: ManualClock) -> None:
    queue = MemoryQueue(30.0, clock=clock, fifo=True)
    fill(queue, "g", 4)
    running = threading.Event()
    may_finish = threading.Event()
    seen: list[str] = []

    def handle(message: Message) -> None:
        seen.append(str(message.body))
        running.set()
        assert may_finish.wait(WAIT)

    worker = Worker(queue, handle, wait_seconds=1, shutdown_timeout=10, clock=clock, **MANUAL)
    thread, _ = run_in_thread(worker.run)
    assert running.wait(WAIT)
    worker.stop(timeout=0)
    may_finish.set()
    # Time moves on only once the handler has ended and its delete was answered: on a
    # loaded machine its thread may run well after the event is set, and a clock
    # driven meanwhile would end the shutdown's wait (10 s) without it.
    deadline = time.monotonic() + WAIT
    while (worker.running or worker.unsettled) and time.monotonic() < deadline:
        time.sleep(0.01)
    drive(clock, thread)
    assert seen == ["g:0"]  # nothing more of g started once stopping
    assert queue.deleted_ids and len(queue) == 3 and queue.visible_count() == 3


def test_async_worker_keeps_each_groups_order_and_holds_a_group_back(clock: ManualClock) -> None:
    queue = MemoryQueue(30.0, clock=clock, fifo=True)
    fill(queue, "abc", 5)
    journal = Journal()
    first_of_each: list[str] = []
    together: list[asyncio.Event] = []

    async def handle(message: Message) -> None:
        group, index = journal.begin(message)
        if index == 0:  # each group's first waits for the others': side by side
            if not together:
                together.append(asyncio.Event())
            first_of_each.append(group)
            if len(first_of_each) == 3:
                together[0].set()
            await asyncio.wait_for(together[0].wait(), WAIT)
        if message.body == "b:1" and journal.tries["b:1"] == 1:
            journal.end(message, ok=False)
            raise ValueError("the first try of b:1 fails")
        await asyncio.sleep(0)
        journal.end(message)

    worker = AsyncWorker(
        queue, handle, concurrency=8, wait_seconds=1, release_delay=5, clock=clock, **MANUAL
    )
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(asyncio.run(worker.run(until_idle=20))))
    thread.start()
    drive(clock, thread)
    assert journal.done == {group: list(range(5)) for group in "abc"}
    assert journal.order["b"] == [0, 1, 1, 2, 3, 4] and journal.most_of_a_group == 1
    assert journal.most_groups == 3
    # b:1 went back with what of b the worker held behind it (received again since).
    assert (out[0].failed, out[0].completed) == (1, 15) and out[0].held_back >= 1
    assert out[0].received == 15 + 1 + out[0].held_back
    assert len(queue) == 0


@pytest.mark.parametrize("kind", ["Worker", "AsyncWorker"])
def test_stats_count_the_groups_waiting_on_an_earlier_message(
    clock: ManualClock, kind: str
) -> None:
    queue = MemoryQueue(30.0, clock=clock, fifo=True)
    fill(queue, "ab", 3)
    seen: list[int] = []

    def look(message: Message) -> None:
        if str(message.body).endswith(":0"):
            seen.append(worker.stats.groups_waiting)

    async def handle(message: Message) -> None:
        look(message)

    options: dict[str, Any] = {"concurrency": 8, "wait_seconds": 1, "clock": clock, **MANUAL}
    if kind == "Worker":
        worker: Any = Worker(queue, look, **options)
        stats = run_worker(clock, worker)
    else:
        worker = AsyncWorker(queue, handle, **options)
        out: list[Any] = []
        thread = threading.Thread(target=lambda: out.append(asyncio.run(worker.run(until_idle=5))))
        thread.start()
        drive(clock, thread)
        stats = out[0]
    assert seen and max(seen) == 2  # both groups waited on their first message
    assert stats.groups_waiting == 0 and stats.per_queue["memory"].groups_waiting == 0
    assert stats.completed == 6
