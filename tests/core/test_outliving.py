"""When a job outlives its lease, on purpose (issue 24), on a ManualClock.

- ``stall_timeout``: a lease whose handler shows no progress for that long stops
  being renewed and is lost (``stalled``); progress() and checkpoint() keep it.
- ``on_cap="rollover"``: ``lease.rolling`` is set two extend thresholds before
  the service's cap; raising ``Rollover`` sends a continuation carrying the last
  checkpoint, then deletes the original; the continuation's handler reads
  ``resumed`` and ``lineage``. A handler that ignores the signal is capped.
- ``current_lease()`` in ``Worker`` and ``AsyncWorker`` handlers.
- ``renewer="auto"``: the process renewer where it can run, else the thread one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

from leasekeeper import (
    ConfigError,
    LeaseConfig,
    LeaseLost,
    LeaseManager,
    LeaseState,
    Lineage,
    LostReason,
    Message,
    Rollover,
    Worker,
    current_lease,
)
from leasekeeper.aio import AsyncWorker
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.clock import wait_until
from leasekeeper.testing import FaultyBackend, ManualClock
from tests.core.test_worker import drive, run_in_thread

# 30 s leases renewed 10 s before their deadline; the cap 100 s after the receive,
# so a lease is told to roll over at 80 s (two thresholds before the cap).
FAST = {"visibility_timeout": 30.0, "timer_interval": 1.0, "minimal_life": 2.0}
CAP = 100.0
THRESHOLD = 10.0


def sleep(clock: ManualClock, seconds: float) -> None:
    """A handler's step of work that takes ``seconds`` of the test's clock."""
    until = clock.now() + seconds
    gate = threading.Condition()
    with gate:
        while clock.now() < until:
            wait_until(clock, gate, until)


# ------------------------------------------------------------------ configuration


def test_the_settings_are_checked() -> None:
    assert LeaseConfig().stall_timeout is None and LeaseConfig().on_cap == "abandon"
    assert LeaseConfig(stall_timeout=5).stall_timeout == 5.0
    for bad in (0, -1, "5", float("nan")):
        with pytest.raises(ConfigError, match="stall_timeout"):
            LeaseConfig(stall_timeout=bad)
    with pytest.raises(ConfigError, match="on_cap must be one of 'abandon', 'rollover'"):
        LeaseConfig(on_cap="roll")  # type: ignore[arg-type]


# ------------------------------------------------------------------ stalls


def test_a_lease_without_progress_for_stall_timeout_is_let_go(clock: ManualClock) -> None:
    queue = MemoryQueue(30.0, clock=clock)
    queue.send("job")
    reasons: list[LostReason] = []
    manager = LeaseManager(
        queue, clock=clock, stall_timeout=15, on_lost=lambda _, r: reasons.append(r), **FAST
    )
    [held] = manager.receive()
    for _ in range(6):  # 60 s of steady progress: renewed all along
        clock.advance(10)
        held.progress()
    assert held.state is LeaseState.ACTIVE and held.extensions >= 2
    last_progress = clock.now()
    clock.advance(30)  # then nothing: the next due extend after 15 s idle is not sent
    assert held.state is LeaseState.LOST and held.lost.is_set()
    assert held.lost_reason is LostReason.STALLED and reasons == [LostReason.STALLED]
    assert "no progress for" in (held.reason or "")
    with pytest.raises(LeaseLost):
        held.check()
    # Back on the queue within stall_timeout + one visibility timeout.
    clock.advance(last_progress + 15 + 30 - clock.now())
    assert queue.visible_count() == 1
    assert manager.stats().lost_reasons == {"stalled": 1}
    manager.close()


def test_checkpoint_is_progress_and_a_watch_never_stalls(clock: ManualClock) -> None:
    queue = MemoryQueue(30.0, clock=clock)
    queue.send_many(["job", "framework's"])
    manager = LeaseManager(queue, clock=clock, stall_timeout=15, **FAST)
    first, second = queue.receive(max_messages=2)
    held = manager.register(first)
    watched = manager.watch(second)
    for step in range(12):  # two minutes
        clock.advance(10)
        held.checkpoint({"step": step})
    assert held.state is LeaseState.ACTIVE
    assert watched.state is LeaseState.ACTIVE  # nobody of ours reports its progress
    held.complete()
    watched.forget()
    manager.close()


# ------------------------------------------------------------------ rollover


def test_rolling_is_set_two_thresholds_before_the_cap(clock: ManualClock) -> None:
    queue = MemoryQueue(30.0, clock=clock, max_lease_age=CAP)
    queue.send("job")
    manager = LeaseManager(queue, clock=clock, on_cap="rollover", **FAST)
    [held] = manager.receive()
    hard = held.message.hard_deadline  # the cap, less the backend's margin
    assert hard is not None and hard <= clock.now() + CAP
    clock.advance(hard - 2 * THRESHOLD - 0.5 - clock.now())
    assert not held.rolling.is_set()
    held.check()  # nothing to say yet
    clock.advance(1)
    assert held.rolling.is_set() and held.state is LeaseState.ACTIVE
    with pytest.raises(Rollover):
        held.check()
    # Renewed to the cap, and held until then (not reported capped a threshold early).
    clock.advance(hard - 0.5 - clock.now())
    assert held.state is LeaseState.ACTIVE and not held.is_lost
    clock.advance(1)
    assert held.state is LeaseState.ABANDONED and held.lost_reason is LostReason.CAPPED
    manager.close(release=False)


def test_a_rollover_carries_the_checkpoint_and_deletes_the_original(clock: ManualClock) -> None:
    queue = MemoryQueue(30.0, clock=clock, max_lease_age=CAP)
    original = queue.send("the job's body")
    manager = LeaseManager(queue, clock=clock, on_cap="rollover", **FAST)
    [held] = manager.receive()
    assert (held.resumed, held.lineage) == (None, Lineage(original, 0))
    with held:
        held.checkpoint({"done": 3})
        held.checkpoint({"done": 7, "note": "ünïcode"})
        raise Rollover
    assert held.state is LeaseState.COMPLETED and original in queue.deleted_ids
    [nxt] = manager.receive()
    assert nxt.message.body == "the job's body"  # the envelope is not the handler's
    assert nxt.resumed == {"done": 7, "note": "ünïcode"}
    assert nxt.lineage == Lineage(original, 1)
    with nxt:  # a hop that saves nothing new carries the checkpoint it got
        raise Rollover
    [third] = manager.receive()
    assert third.lineage == Lineage(original, 2) and third.resumed == {"done": 7, "note": "ünïcode"}
    with third:
        pass
    assert len(queue) == 0
    stats = manager.stats()
    assert (stats.rolled_over, stats.completed, stats.lost, stats.abandoned) == (2, 3, 0, 0)
    manager.close()


def test_a_checkpoint_must_be_json(clock: ManualClock) -> None:
    queue = MemoryQueue(30.0, clock=clock)
    queue.send("job")
    manager = LeaseManager(queue, clock=clock, **FAST)
    [held] = manager.receive()
    with pytest.raises(TypeError):
        held.checkpoint({"when": object()})
    with pytest.raises(ValueError):
        held.checkpoint(float("nan"))
    held.complete()
    manager.close()


def test_a_lost_lease_sends_no_continuation(clock: ManualClock) -> None:
    queue = MemoryQueue(30.0, clock=clock, max_lease_age=CAP)
    queue.send("job")
    manager = LeaseManager(queue, clock=clock, on_cap="rollover", **FAST)
    [held] = manager.receive()
    manager.close(release=False)
    clock.advance(31)  # unrenewed past its deadline: another consumer may have it
    with pytest.raises(LeaseLost), held:
        raise Rollover
    assert len(queue) == 1 and queue.calls["receive"] == 1  # nothing sent


def test_a_failed_send_releases_the_original(clock: ManualClock) -> None:
    class Refusing(MemoryQueue):
        refuse = False

        def send(self, body: str | bytes, *args: Any, **kwargs: Any) -> str:
            if self.refuse:
                raise ConnectionError("the service is unreachable")
            return super().send(body, *args, **kwargs)

    queue = Refusing(30.0, clock=clock, max_lease_age=CAP)
    queue.send("job")
    queue.refuse = True
    manager = LeaseManager(queue, clock=clock, on_cap="rollover", **FAST)
    [held] = manager.receive()
    with pytest.raises(ConnectionError), held:
        held.checkpoint(1)
        raise Rollover
    assert held.state is LeaseState.RELEASED
    clock.advance(2)  # the release delay (1 s, jittered)
    assert len(queue) == 1 and queue.visible_count() == 1  # the original, to redo
    assert manager.stats().rolled_over == 0
    manager.close()


def test_a_capped_answer_keeps_a_rolling_lease_to_its_deadline(clock: ManualClock) -> None:
    """The service refuses an extend as capped one extend earlier than the lease
    expected (MemoryQueue's cap has no margin; a real clock reads later at the
    queue than at the manager): with on_cap="rollover" the handler is told to roll
    over and keeps the message until its deadline, instead of being told it lost it."""
    queue = MemoryQueue(30.0, clock=clock)
    queue.send_many(["rolling", "abandoning"])
    faulty = FaultyBackend(queue, clock=clock)
    rolling = LeaseManager(faulty, clock=clock, on_cap="rollover", **FAST)
    abandoning = LeaseManager(faulty, clock=clock, **FAST)
    first, second = faulty.receive(max_messages=2)
    a, b = rolling.register(first), abandoning.register(second)
    faulty.script("extend", "capped", "capped")
    clock.advance(20)  # both due: the service answers capped
    assert b.state is LeaseState.ABANDONED and b.lost_reason is LostReason.CAPPED
    assert a.state is LeaseState.ACTIVE and a.rolling.is_set() and not a.is_lost
    deadline = a.visible_until
    clock.advance(deadline - clock.now() - 1)
    assert a.state is LeaseState.ACTIVE  # no more extends, but still the handler's
    clock.advance(1)
    assert a.state is LeaseState.ABANDONED and a.lost_reason is LostReason.CAPPED
    rolling.close(release=False)
    abandoning.close(release=False)


def drive_jobs(clock: ManualClock, thread: threading.Thread, worker: Worker) -> None:
    """``drive``, but time moves only once every running handler waits on the clock
    too (as well as the receive loop): a handler that was woken is never left behind
    by a clock that runs on without it, whatever the machine's load."""
    for _ in range(10_000):
        if not thread.is_alive():
            return
        if clock.wait_for_sleepers(1 + worker.running, timeout=0.2):
            clock.advance(1.0)
    raise AssertionError("the worker never finished")


def job(clock: ManualClock, steps: int, seen: list[tuple[Any, ...]]) -> Any:
    """A handler: ``steps`` steps of 10 s, a checkpoint after each; it resumes where
    its checkpoint says and checks for a rollover before each step."""

    def handle(message: Message) -> None:
        held = current_lease()
        done = held.resumed or 0
        seen.append((held.lineage, done, message.body))
        while done < steps:
            held.check()  # raises Rollover once rolling is set
            sleep(clock, 10)
            done += 1
            held.checkpoint(done)

    return handle


def test_a_worker_rolls_a_long_job_over_twice(clock: ManualClock) -> None:
    """The job takes over twice the cap: each hop works until it is told to roll
    over, 100 s of its 120 s (two 10-s thresholds before the cap), so 250 s of work
    finish through two rollovers, each hop carrying the last checkpoint, every
    original deleted, one holder at a time."""
    cap = 120.0
    queue = MemoryQueue(30.0, clock=clock, max_lease_age=cap)
    first = queue.send("payload")
    seen: list[tuple[Any, ...]] = []
    worker = Worker(
        queue,
        job(clock, 25, seen),
        concurrency=2,
        wait_seconds=1,
        clock=clock,
        on_cap="rollover",
        **FAST,
    )
    thread, out = run_in_thread(worker.run, until_idle=5)
    drive_jobs(clock, thread, worker)
    [stats] = out
    assert [(lineage, body) for lineage, _, body in seen] == [
        (Lineage(first, 0), "payload"),
        (Lineage(first, 1), "payload"),
        (Lineage(first, 2), "payload"),
    ]
    starts = [done for _, done, _ in seen]
    assert starts == [0, 10, 20]  # each resumed where the last checkpoint stood
    assert (stats.rolled_over, stats.completed, stats.lost, stats.failed) == (2, 1, 0, 0)
    assert len(queue) == 0 and len(queue.deleted_ids) == 3
    assert max(queue.receive_counts.values()) == 1  # no message was ever delivered twice
    manager_stats = worker.manager.stats()
    assert (manager_stats.rolled_over, manager_stats.capped, manager_stats.lost) == (2, 0, 0)


def test_a_job_of_three_caps_takes_the_fewest_hops_a_cap_allows(clock: ManualClock) -> None:
    """Three caps of work cannot fit in three hops of less than a cap each: four is
    the fewest. Rolling two thresholds before the cap leaves each hop 100 s of its
    120, so 360 s of work finish in four hops, three rollovers."""
    cap = 120.0
    queue = MemoryQueue(30.0, clock=clock, max_lease_age=cap)
    first = queue.send("three caps of work")
    seen: list[tuple[Any, ...]] = []
    worker = Worker(
        queue, job(clock, 36, seen), wait_seconds=1, clock=clock, on_cap="rollover", **FAST
    )
    thread, out = run_in_thread(worker.run, until_idle=5)
    drive_jobs(clock, thread, worker)
    [stats] = out
    assert [(lineage, done) for lineage, done, _ in seen] == [
        (Lineage(first, hop), 10 * hop) for hop in range(4)
    ]
    assert (stats.rolled_over, stats.completed, stats.lost) == (3, 1, 0)
    assert len(queue) == 0 and max(queue.receive_counts.values()) == 1


def test_a_handler_that_ignores_rolling_is_capped(clock: ManualClock) -> None:
    queue = MemoryQueue(30.0, clock=clock, max_lease_age=CAP)
    queue.send("job")
    manager = LeaseManager(queue, clock=clock, on_cap="rollover", **FAST)
    [held] = manager.receive()
    clock.advance(CAP + 1)
    assert held.rolling.is_set()
    assert held.state is LeaseState.ABANDONED and held.lost_reason is LostReason.CAPPED
    stats = manager.stats()
    assert (stats.capped, stats.rolled_over) == (1, 0)
    manager.close(release=False)


# ------------------------------------------------------------------ current_lease


def test_current_lease_is_the_handlers_own_in_both_workers(clock: ManualClock) -> None:
    with pytest.raises(LookupError):
        current_lease()
    queue = MemoryQueue(30.0, clock=clock)
    queue.send_many(["a", "b", "c"])
    mine: dict[str, bool] = {}

    def handler(message: Message) -> None:
        mine[message.id] = current_lease() is worker.manager.get(message)

    worker = Worker(queue, handler, concurrency=3, wait_seconds=1, clock=clock, **FAST)
    thread, _ = run_in_thread(worker.run, until_idle=5)
    drive(clock, thread)
    assert mine == {m: True for m in mine} and len(mine) == 3

    async_queue = MemoryQueue(30.0)
    async_queue.send_many(["d", "e"])
    async_mine: dict[str, bool] = {}

    async def async_handler(message: Message) -> None:
        from leasekeeper import aio

        lease = current_lease()
        async_mine[message.id] = (
            lease is async_worker.manager.get(message) and aio.current_lease().lease is lease
        )

    async_worker = AsyncWorker(async_queue, async_handler, wait_seconds=0.05)
    asyncio.run(async_worker.run(until_idle=0.3))
    assert async_mine == {m: True for m in async_mine} and len(async_mine) == 2


def test_an_async_handler_rolls_over_too() -> None:
    queue = MemoryQueue(30.0, max_lease_age=3600.0)
    first = queue.send("job")
    hops: list[Any] = []

    async def handler(message: Message) -> None:
        held = current_lease()
        hops.append((held.lineage.hop, held.resumed))
        if held.lineage.hop < 2:
            held.checkpoint({"hop": held.lineage.hop})
            raise Rollover

    worker = AsyncWorker(queue, handler, wait_seconds=0.05, on_cap="rollover")
    stats = asyncio.run(worker.run(until_idle=0.5))
    assert hops == [(0, None), (1, {"hop": 0}), (2, {"hop": 1})]
    assert (stats.rolled_over, stats.completed) == (2, 1) and len(queue) == 0
    assert worker.manager.stats().rolled_over == 2 and first in queue.deleted_ids


# ------------------------------------------------------------------ the default renewer


def test_auto_renews_in_a_thread_where_no_process_could(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """MemoryQueue lives in this process and a ManualClock is no system clock: the
    thread renewer, with nothing to warn about (nothing is lost that could be had)."""
    with caplog.at_level(logging.DEBUG, logger="leasekeeper"):
        worker = Worker(MemoryQueue(30.0), lambda m: None)
        assert worker.manager.renewer.name == "thread"
        on_manual = LeaseManager(MemoryQueue(30.0, clock=clock), renewer="auto", clock=clock)
        assert on_manual.renewer.name == "thread"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    worker.manager.close()
    on_manual.close()


def test_auto_falls_back_to_a_thread_with_one_warning_when_no_process_starts(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A sandbox that forbids starting processes: the worker renews in a thread and
    says once what that loses."""
    import subprocess

    from benchmarks.nullq import NullBackend

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(1, "Operation not permitted (no fork/spawn here)")

    monkeypatch.setattr(subprocess, "Popen", forbidden)
    with caplog.at_level(logging.WARNING, logger="leasekeeper"):
        worker = Worker(NullBackend(), lambda m: None)  # type: ignore[arg-type]
    assert worker.manager.renewer.name == "thread"
    [warning] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    text = warning.getMessage()
    assert "the renewer process could not start" in text and "Operation not permitted" in text
    assert "holds the GIL" in text and "visibility timeout" in text
    worker.manager.close()


def test_the_continuation_envelope_is_left_alone_when_unreadable(clock: ManualClock) -> None:
    """A body that merely starts like an envelope reaches the handler as it is."""
    queue = MemoryQueue(30.0, clock=clock)
    body = "leasekeeper-continuation/1\nnot json\nrest"
    queue.send(body)
    manager = LeaseManager(queue, clock=clock, **FAST)
    [held] = manager.receive()
    assert held.message.body == body and held.lineage == Lineage(held.id, 0)
    assert held.resumed is None
    held.complete()
    manager.close()
