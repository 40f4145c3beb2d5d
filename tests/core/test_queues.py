"""One worker on several queues: weights, empty queues, per-queue policies and figures.

On a ManualClock with one handler and receives of one message, the order in which
messages complete is the order of the receives, so the proportions are exact.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from leasekeeper import Message, Worker, current_lease
from leasekeeper.aio import AsyncWorker
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.testing import ManualClock
from tests.core.test_worker import MANUAL, drive, run_in_thread


def filled(clock: ManualClock, name: str, count: int) -> MemoryQueue:
    queue = MemoryQueue(30.0, clock=clock, name=name)
    for n in range(count):
        queue.send(f"{name} {n}")
    return queue


def test_weights_share_the_receives_and_every_message_runs_once(clock: ManualClock) -> None:
    urgent, bulk = filled(clock, "urgent", 150), filled(clock, "bulk", 150)
    order: list[str] = []
    lock = threading.Lock()

    def handler(message: Message) -> None:
        with lock:
            order.append(str(message.body))

    worker = Worker(
        [urgent, bulk],
        handler,
        weights=[3, 1],
        concurrency=1,
        batch_size=1,
        prefetch=0,
        wait_seconds=1,
        clock=clock,
        **MANUAL,
    )
    thread, out = run_in_thread(worker.run, until_idle=5)
    drive(clock, thread)
    (stats,) = out
    first = order[:100]
    heavy = sum(body.startswith("urgent") for body in first)
    assert 60 <= heavy <= 90 and 100 - heavy >= 10
    # Spread out, not in runs: the light queue gets a turn in every four.
    assert all(any(b.startswith("bulk") for b in order[i : i + 4]) for i in range(0, 100, 4))
    assert sorted(order) == sorted(
        [f"urgent {n}" for n in range(150)] + [f"bulk {n}" for n in range(150)]
    )
    assert len(urgent) == 0 and len(bulk) == 0
    assert (stats.received, stats.completed) == (300, 300)
    assert stats.per_queue["urgent"].completed == 150 == stats.per_queue["bulk"].completed
    assert stats.per_queue["urgent"].received == 150


def test_an_empty_queue_does_not_hold_up_one_that_has_messages(clock: ManualClock) -> None:
    urgent, bulk = filled(clock, "urgent", 0), filled(clock, "bulk", 40)
    started = clock.now()
    handled_at: list[float] = []
    asked_empty: list[int] = []

    def handler(message: Message) -> None:
        handled_at.append(clock.now())
        asked_empty.append(urgent.calls["receive"])

    worker = Worker(
        [urgent, bulk],
        handler,
        weights=[3, 1],
        concurrency=1,
        batch_size=1,
        prefetch=0,
        wait_seconds=20,
        clock=clock,
        **MANUAL,
    )
    thread, out = run_in_thread(worker.run, until_idle=5)
    drive(clock, thread)
    assert out[0].completed == 40 and len(bulk) == 0
    # No receive waited: the empty queue was asked with a short poll, then rested
    # while the other was drained (a long poll of 20 s on it would have moved the
    # clock before every message).
    assert handled_at[-1] == started
    assert asked_empty[-1] <= 3


def test_every_queue_empty_the_worker_polls_each_about_once_a_second(
    clock: ManualClock,
) -> None:
    urgent, bulk = filled(clock, "urgent", 0), filled(clock, "bulk", 0)
    worker = Worker(
        [urgent, bulk], lambda m: None, weights=[3, 1], wait_seconds=20, clock=clock, **MANUAL
    )
    thread, _ = run_in_thread(worker.run, until_idle=30)
    drive(clock, thread, step=0.25)
    # Idle for 30 s: each queue asked at most a few times a second, never in a loop,
    # and the light queue as well as the heavy one (a message on either waits ~1 s).
    for queue in (urgent, bulk):
        assert 10 <= queue.calls["receive"] <= 30 * 4


def test_each_queue_has_its_own_dead_letter_queue_and_max_receives(clock: ManualClock) -> None:
    urgent, bulk = filled(clock, "urgent", 1), filled(clock, "bulk", 1)
    dead_urgent = MemoryQueue(30.0, clock=clock, name="urgent-dead")
    dead_bulk = MemoryQueue(30.0, clock=clock, name="bulk-dead")
    receives: dict[str, int] = {}

    def failing(message: Message) -> None:
        receives[str(message.body)] = message.receive_count
        raise ValueError("poison")

    worker = Worker(
        [urgent, bulk],
        failing,
        dead_letter=[dead_urgent, dead_bulk],
        max_receives=[1, 3],
        release_delay=0.0,
        wait_seconds=1,
        clock=clock,
        **MANUAL,
    )
    thread, out = run_in_thread(worker.run, until_idle=60)
    drive(clock, thread)
    assert [m.body for m in dead_urgent.receive(max_messages=10)] == ["urgent 0"]
    assert [m.body for m in dead_bulk.receive(max_messages=10)] == ["bulk 0"]
    assert receives == {"urgent 0": 1, "bulk 0": 3}
    per_queue = out[0].per_queue
    assert (per_queue["urgent"].dead_lettered, per_queue["bulk"].dead_lettered) == (1, 1)
    assert (per_queue["urgent"].failed, per_queue["bulk"].failed) == (0, 2)
    assert out[0].dead_lettered == 2 and worker.manager.stats().dead_lettered == 2


def test_the_handler_knows_which_queue_its_message_came_from(clock: ManualClock) -> None:
    urgent, bulk = filled(clock, "urgent", 3), filled(clock, "bulk", 3)
    seen: list[tuple[str, Any]] = []

    def handler(message: Message) -> None:
        seen.append((str(message.body), current_lease().message.backend))

    worker = Worker([urgent, bulk], handler, wait_seconds=1, clock=clock, **MANUAL)
    thread, _ = run_in_thread(worker.run, until_idle=5)
    drive(clock, thread)
    assert len(seen) == 6
    for body, backend in seen:
        assert backend is (urgent if body.startswith("urgent") else bulk)
    assert worker.backends == [urgent, bulk]


def test_async_worker_takes_several_queues_by_weight(clock: ManualClock) -> None:
    urgent, bulk = filled(clock, "urgent", 40), filled(clock, "bulk", 40)
    order: list[str] = []

    async def handler(message: Message) -> None:
        order.append(str(message.body))

    worker = AsyncWorker(
        [urgent, bulk],
        handler,
        weights=[3, 1],
        concurrency=1,
        batch_size=1,
        prefetch=0,
        wait_seconds=1,
        clock=clock,
        **MANUAL,
    )
    out: list[Any] = []
    thread = threading.Thread(
        target=lambda: out.append(asyncio.run(worker.run(until_idle=5))), daemon=True
    )
    thread.start()
    drive(clock, thread)
    heavy = sum(body.startswith("urgent") for body in order[:40])
    assert heavy == 30  # 3 in every 4 while both have messages
    assert out[0].completed == 80 and len(urgent) == 0 == len(bulk)
    assert out[0].per_queue["bulk"].completed == 40


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"weights": [3]}, "weights has 1 entries for 2 queues"),
        ({"weights": [3, 0]}, "weights must be integers >= 1"),
        ({"max_receives": [1, 2, 3]}, "max_receives has 3 entries for 2 queues"),
        ({"dead_letter": [MemoryQueue(30.0)]}, "dead_letter has 1 entries for 2 queues"),
    ],
)
def test_per_queue_arguments_must_match_the_queues(
    clock: ManualClock, kwargs: dict[str, Any], words: str
) -> None:
    queues = [MemoryQueue(30.0, clock=clock, name="a"), MemoryQueue(30.0, clock=clock, name="b")]
    with pytest.raises(ValueError, match=words):
        Worker(queues, lambda m: None, clock=clock, **MANUAL, **kwargs)


def test_weights_need_several_queues_and_one_queue_is_as_before(clock: ManualClock) -> None:
    queue = filled(clock, "jobs", 2)
    with pytest.raises(TypeError, match="weights are for a Worker of several queues"):
        Worker(queue, lambda m: None, weights=[1], clock=clock)
    with pytest.raises(ValueError, match="the same queue twice"):
        Worker([queue, queue], lambda m: None, clock=clock)
    worker = Worker(queue, lambda m: None, wait_seconds=1, clock=clock, **MANUAL)
    thread, out = run_in_thread(worker.run, until_idle=3)
    drive(clock, thread)
    assert out[0].completed == 2 and list(out[0].per_queue) == ["jobs"]
