"""Poison messages end, they do not loop; a decorated handler given to a worker runs
once. On MemoryQueue with a ManualClock: the workers' waits, the growing release
delays and the queue's visibility all read the test's clock."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

from leasekeeper import LeaseManager, LeaseState, Message, Worker, aio, leased
from leasekeeper.aio import AsyncWorker
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.failures import DEFAULT_MAX_RECEIVES, ERROR, RECEIVES, RETRIED_FOR_EVER, SOURCE
from leasekeeper.testing import ManualClock
from tests.core.test_worker import drive, run_in_thread
from tests.helpers import ScriptedBackend

TIMING = {"visibility_timeout": 30.0, "timer_interval": 1.0, "minimal_life": 2.0}


def failing(message: Message) -> None:
    raise ValueError("this message always fails")


def test_a_poison_message_goes_to_the_dead_letter_queue_after_max_receives(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    queue = MemoryQueue(30, clock=clock, name="jobs")
    dead = MemoryQueue(30, clock=clock, name="jobs-dead")
    sent = queue.send("poison", {"tenant": "acme"})
    caplog.set_level(logging.INFO, logger="leasekeeper")
    worker = Worker(
        queue, failing, wait_seconds=1, max_receives=3, dead_letter=dead, clock=clock, **TIMING
    )
    thread, out = run_in_thread(worker.run, until_idle=60)
    drive(clock, thread, step=1.0)
    stats = out[0]
    # Received exactly three times, failed each time, then moved: gone from its queue.
    assert queue.receive_counts[sent] == 3
    assert (stats.failed, stats.dead_lettered, stats.completed) == (2, 1, 0)
    assert len(queue) == 0 and queue.deleted_ids == [sent]
    (copy,) = dead.receive()
    assert copy.body == "poison"
    assert copy.attributes["tenant"] == "acme"
    assert copy.attributes[RECEIVES] == "3" and copy.attributes[ERROR] == "ValueError"
    assert copy.attributes[SOURCE]
    assert worker.manager.stats().dead_lettered == 1
    # No hot loop: a line per failure, and one saying where failing messages go.
    lines = [r for r in caplog.records if r.name.startswith("leasekeeper")]
    assert len(lines) < 20
    failures = [r.getMessage() for r in lines if "handler failed" in r.getMessage()]
    assert len(failures) == 3
    assert "receive 1 of 3" in failures[0] and "receive 3 of 3" in failures[2]
    assert "dead-letter" in failures[2]
    assert not any("receipt" in r.getMessage().lower() for r in lines)


def test_failed_messages_come_back_after_growing_jittered_delays(clock: ManualClock) -> None:
    runs = []
    for seed in (7, 7, 8):
        queue = ScriptedBackend(MemoryQueue(30, clock=clock))
        queue.inner.send("poison")
        manager = LeaseManager(queue, clock=clock, jitter_seed=seed, **TIMING)
        for _ in range(5):
            clock.advance(400)  # whatever the last delay was, it is visible again
            (held,) = manager.receive()
            with pytest.raises(ValueError), held:
                raise ValueError("fails")
            assert held.state is LeaseState.RELEASED
        manager.close()
        runs.append([delay for _, _, delay in queue.calls_of("release")])
    same_seed, again, other_seed = runs
    assert same_seed == again  # the jitter replays under jitter_seed
    assert same_seed != other_seed
    # 1 s, 2 s, 4 s, 8 s, 16 s: doubling per receive, each within +-20 %.
    for n, delay in enumerate(same_seed):
        assert 0.8 * 2**n <= delay <= 1.2 * 2**n, (n, delay)


def test_with_held_dead_letters_too(clock: ManualClock) -> None:
    queue = MemoryQueue(30, clock=clock)
    dead = MemoryQueue(30, clock=clock)
    queue.send("poison")
    manager = LeaseManager(queue, clock=clock, dead_letter=dead, **TIMING)
    assert manager.failures.max_receives == DEFAULT_MAX_RECEIVES
    for _ in range(DEFAULT_MAX_RECEIVES):
        clock.advance(400)
        (held,) = manager.receive()
        with pytest.raises(ValueError), held:
            raise ValueError("fails")
    assert held.state is LeaseState.COMPLETED and len(queue) == 0
    assert [m.body for m in dead.receive(max_messages=10)] == ["poison"]
    assert manager.stats().dead_lettered == 1


@pytest.fixture
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if no failure had been seen in this process yet (the suite's tests share one)."""
    monkeypatch.setattr(RETRIED_FOR_EVER, "said", False)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_without_a_dead_letter_queue_the_first_failure_says_failing_messages_retry_for_ever(
    clock: ManualClock, caplog: pytest.LogCaptureFixture, fresh_process: None
) -> None:
    caplog.set_level(logging.INFO, logger="leasekeeper")
    for _ in range(2):  # two workers of one process, each failing a message three times
        queue = MemoryQueue(30, clock=clock)
        queue.send("fails")
        worker = Worker(queue, failing, wait_seconds=1, clock=clock, **TIMING)
        thread, out = run_in_thread(worker.run, until_idle=20)
        drive(clock, thread)
        assert out[0].failed >= 3
    warnings = warnings_of(caplog)
    said = [i for i, w in enumerate(warnings) if "retried for ever" in w]
    first_failure = next(i for i, w in enumerate(warnings) if "handler failed" in w)
    assert len(said) == 1 and said[0] > first_failure, warnings  # once, after the failure
    assert "max_receives" in warnings[said[0]] and "dead_letter" in warnings[said[0]]


def test_a_run_where_every_job_succeeds_says_nothing_of_retrying_for_ever(
    clock: ManualClock, caplog: pytest.LogCaptureFixture, fresh_process: None
) -> None:
    caplog.set_level(logging.INFO, logger="leasekeeper")
    queue = MemoryQueue(30, clock=clock)
    for n in range(3):
        queue.send(f"job {n}")
    worker = Worker(queue, lambda message: None, wait_seconds=1, clock=clock, **TIMING)
    thread, out = run_in_thread(worker.run, until_idle=2)
    drive(clock, thread)
    manager = LeaseManager(queue, clock=clock, **TIMING)
    queue.send("one more")
    for held in manager.receive(max_messages=10):
        with held:
            pass
    manager.close()
    assert out[0].completed == 3 and len(queue) == 0
    assert not any("for ever" in w for w in warnings_of(caplog)), warnings_of(caplog)
    assert not RETRIED_FOR_EVER.said


def test_with_a_dead_letter_queue_a_failure_says_nothing_of_retrying_for_ever(
    clock: ManualClock, caplog: pytest.LogCaptureFixture, fresh_process: None
) -> None:
    caplog.set_level(logging.INFO, logger="leasekeeper")
    queue = MemoryQueue(30, clock=clock)
    queue.send("fails once")
    manager = LeaseManager(queue, clock=clock, dead_letter=MemoryQueue(30, clock=clock), **TIMING)
    (held,) = manager.receive()
    with pytest.raises(ValueError), held:
        raise ValueError("fails")
    manager.close()
    assert any("handler failed" in w for w in warnings_of(caplog))
    assert not any("for ever" in w for w in warnings_of(caplog))


def test_a_leased_handler_given_to_a_worker_runs_once_and_is_deleted_once(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    queue = MemoryQueue(30, clock=clock)
    for n in range(5):
        queue.send(f"job {n}")
    seen: list[str] = []
    lock = threading.Lock()

    @leased
    def handle(message: Message) -> None:
        with lock:
            seen.append(str(message.body))

    caplog.set_level(logging.INFO, logger="leasekeeper.worker")
    worker = Worker(queue, handle, wait_seconds=1, clock=clock, **TIMING)
    thread, out = run_in_thread(worker.run, until_idle=3)
    drive(clock, thread)
    assert out[0].completed == 5 and out[0].lost == 0
    assert sorted(seen) == [f"job {n}" for n in range(5)]
    assert len(queue.deleted_ids) == 5 == len(set(queue.deleted_ids))
    assert queue.calls["delete"] <= 5  # not a second delete per message
    assert any("is @leased" in r.getMessage() for r in caplog.records)


def test_an_aio_leased_handler_given_to_an_async_worker_runs_once(clock: ManualClock) -> None:
    queue = MemoryQueue(30, clock=clock)
    for n in range(3):
        queue.send(f"job {n}")
    seen: list[str] = []

    @aio.leased
    async def handle(message: Message) -> None:
        seen.append(str(message.body))

    worker = AsyncWorker(queue, handle, wait_seconds=1, clock=clock, **TIMING)
    out: list[Any] = []
    thread = threading.Thread(
        target=lambda: out.append(asyncio.run(worker.run(until_idle=3))), daemon=True
    )
    thread.start()
    drive(clock, thread)
    assert out[0].completed == 3 and out[0].lost == 0
    assert sorted(seen) == [f"job {n}" for n in range(3)]
    assert len(queue.deleted_ids) == 3


def test_stats_read_by_name_too(clock: ManualClock) -> None:
    manager = LeaseManager(MemoryQueue(30, clock=clock), clock=clock, **TIMING)
    stats = manager.stats()
    assert stats["dead_lettered"] == stats.dead_lettered == 0
    with pytest.raises(KeyError):
        stats["no such field"]
