"""The dispatcher on its own: when it runs an engine's due work and how it chunks it,
with a stand-in engine (``DueWork``), on a ManualClock and on the system clock."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.clock import SYSTEM_CLOCK, Clock
from leasekeeper.engine._dispatch import Dispatcher, Work
from leasekeeper.engine._schedule import Lane
from leasekeeper.record import LeaseRecord
from leasekeeper.testing import ManualClock


class StandIn:
    """A ``DueWork``: ``due`` maps a time to the work it hands out then."""

    def __init__(self, clock: Clock, lane: Lane, due: dict[float, list[LeaseRecord]]) -> None:
        self._clock = clock
        self.lane = lane
        self.due = due
        self.batches: list[tuple[float, list[str]]] = []
        self.drained = 0
        self.errors = 0
        self.extended = threading.Event()

    @property
    def clock(self) -> Clock:
        return self._clock

    def has_pending(self) -> bool:
        return False

    def collect_locked(self, now: float) -> Work:
        records = [r for t in sorted(self.due) if t <= now for r in self.due.pop(t)]
        return [(self.lane, records)] if records else []

    def next_due_locked(self) -> float | None:
        return min(self.due, default=None)

    def extend_batch(self, lane: Lane, records: Sequence[LeaseRecord]) -> None:
        self.batches.append((self._clock.now(), [r.message.id for r in records]))
        self.extended.set()

    def drain(self) -> None:
        self.drained += 1

    def count_scheduler_error(self) -> None:
        self.errors += 1


def records(queue: MemoryQueue, n: int) -> list[LeaseRecord]:
    queue.send_many([f"m{i}" for i in range(n)])
    return [LeaseRecord(None, m, 0.0) for m in queue.receive(max_messages=n)]


def test_on_a_manual_clock_due_work_runs_inline_at_its_time_in_batches(
    clock: ManualClock,
) -> None:
    queue = MemoryQueue(30, clock=clock)
    queue.max_receive = 20  # type: ignore[attr-defined]
    lane = Lane(queue)  # MemoryQueue's max_batch: 10
    twelve = records(queue, 12)
    start = clock.now()
    work = StandIn(clock, lane, {start + 5: twelve[:12]})
    dispatcher = Dispatcher(work, threading.Lock(), tick=1.0, workers=2)
    dispatcher.start_locked()  # attaches to the clock: no thread
    assert dispatcher.next_wakeup() == start + 5
    clock.advance(4.9)
    assert work.batches == []
    clock.advance(0.2)
    assert [len(ids) for _, ids in work.batches] == [10, 2]  # chunked by max_batch
    assert {at for at, _ in work.batches} == {start + 5}  # at its due time, not later
    dispatcher.stop(None)
    assert dispatcher.next_wakeup() is None and dispatcher.closed


def test_on_the_system_clock_a_scheduler_thread_wakes_for_earlier_work() -> None:
    queue = MemoryQueue(30)
    lane = Lane(queue)
    lock = threading.Lock()
    later = records(queue, 1)
    work = StandIn(SYSTEM_CLOCK, lane, {SYSTEM_CLOCK.now() + 3600: later})
    dispatcher = Dispatcher(work, lock, tick=3600.0, workers=1)
    with lock:
        dispatcher.start_locked()
    assert dispatcher.running
    # Work due now is added, and the sleeping scheduler is woken for it.
    soon = records(queue, 1)
    with lock:
        work.due[SYSTEM_CLOCK.now()] = soon
        dispatcher.wake_locked()
    assert work.extended.wait(30), "the scheduler was not woken"
    assert work.batches[0][1] == [soon[0].message.id]
    assert dispatcher.stop(SYSTEM_CLOCK.now() + 10)
    dispatcher.shutdown(SYSTEM_CLOCK.now() + 10)
    assert not dispatcher.running and not dispatcher.stop(None)  # twice: nothing


def test_run_all_runs_in_parallel_and_says_what_never_ran() -> None:
    lock = threading.Lock()
    queue = MemoryQueue(30)
    work = StandIn(SYSTEM_CLOCK, Lane(queue), {})
    dispatcher = Dispatcher(work, lock, tick=1.0, workers=2)
    with lock:
        dispatcher.start_locked()
    both = threading.Barrier(2, timeout=30)
    ran = dispatcher.run_all([(both.wait, ()), (both.wait, ())], None)
    assert ran == [True, True]  # two at once: the barrier let both through
    dispatcher.stop(None)
    dispatcher.shutdown(None)
